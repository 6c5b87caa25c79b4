"""The built-in provider's ranking (SPEC-0030 REQ-11): which words a recall searches for, the FTS5 plan
that finds its candidates, the order of a metadata-only query, and reciprocal rank fusion.

Split out of `builtin/__init__.py` (which keeps the contract, the documents, the vectors and the stdio server)
so the ranking reads in one sitting. The FTS5 and JSON statements here are the SQLite engine's
(`bm25_candidates`, `metadata_only`, `briefing_order`, `path_candidates`); the pure parts
(`search_words`, `briefing_rank`, `path_ranking`, `rrf`, `rank`) are what every engine's ranking shares.

* **BM25** over FTS5, restricted to the caller's scopes inside FTS5 — the scope's own doc-id range
  (`num << 32 | sequence`, `rowid BETWEEN`, which FTS5 seeks to in each word's doclist) — so the
  work follows the caller's repository, not the store (but for BM25's count of each word's documents
  in the whole table, its IDF, which FTS5 makes once a query). The plan: the AND of every query word
  first; only when that finds fewer than `limit` episodes, every word OR-ed (which includes the AND
  matches). Best 200 candidates by `rank` (BM25 with BM25_WEIGHTS over the content and metadata
  columns; the scope column weighs 0).
* The query's words are searched less STOPWORDS (function words and question phrasing). A query whose
  words only select the scope's episodes — REQ-14's briefing query of repository, branch and harness
  name, which every episode's `meta` column matches alike — is not ranked by BM25 but by what helps the
  next run of the query's harness (`metadata_only`, `briefing_order`: its own recent runs on this branch,
  then runs that fixed a failure on the files it edits most, then recency, this branch,
  failed-then-fixed).
* The path boost (`path_candidates`, `path_ranking`): the episodes that touched a requested path, those
  the text rankings found first in their order, the others after every text match, newest first.
* Rankings are fused by `rrf` (Σ 1/(60 + rank)); `rank` breaks ties by recency (started_at, newest
  first), then by episode id.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Collection, Mapping, MutableMapping, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

import attrs
import sqlite_utils

from ..store import WORD, scope_key, scope_range
from ..store.builtin_docs import BM25_WEIGHTS, CONTENT_COLUMNS, FTS_COLUMNS

RRF_K = 60
CANDIDATES = 200


@attrs.frozen
class Hit:
    episode_id: str
    doc_id: int
    started_at: str
    #: The ranking's own score, higher is better (BM25 negated, cosine similarity): `fuse_hybrid` reads
    #: it; its scale is the ranking's, so it is compared only within one ranking's list.
    score: float = 0.0


def query_words(query: str) -> list[str]:
    """The distinct words of a query, lower-cased, in order."""
    return list(dict.fromkeys(WORD.findall(query.lower())))


#: Words that say how a question is asked, not what it is about: English function words and the
#: phrasing of a question a developer asks before starting work ("has anyone already changed how ...").
#: Dropped from a query unless nothing else is left (with them, the AND of a natural
#: question matched nothing and the OR ranked the episodes that happened to say "anyone" or "did").
STOPWORDS = frozenset("""
a about above after again against all already also am an and any anyone anything are around as at be
because been before being below between both but by can could did do does doing done down during each
ever few for from further get got had has have having he her here hers him his how i if in into is it
its itself just last lately me more most my myself no nor not now of off on once only or other our ours
out over own please previously recent recently same she should so some someone something still such
than that the their theirs them then there these they this those through to too under until up us very
was we were what when where which while who whom why will with would yet you your yours
""".split())


def search_words(query: str) -> list[str]:
    """The words a recall searches for: the query's words less STOPWORDS (all of them when that would
    leave none)."""
    words = query_words(query)
    kept = [w for w in words if w not in STOPWORDS]
    return kept or words


def rank_function(weights: Sequence[float] = ()) -> str:
    """The BM25 rank expression with each FTS column's weight (BM25_WEIGHTS unless given)."""
    return "bm25(" + ", ".join(repr(float(w)) for w in (weights or BM25_WEIGHTS)) + ")"


def scoped_match(words: Sequence[str], scopes: Sequence[str], op: str) -> str:
    """An FTS5 expression that names the scope: one of the scopes' tokens AND the words (joined by
    `op`) in the content and metadata columns — a match on the whole table that stays in the scope
    (the benches' raw FTS5 anchor). A recall searches a scope's doc-id range instead (`range_match`).

    Every word is double-quoted, so FTS5 operators in user text stay inert.
    """
    keys = " OR ".join(f'"{scope_key(s)}"' for s in scopes)
    terms = f" {op} ".join(f'"{w}"' for w in words)
    return f"scope_key : ({keys}) AND {{{' '.join(FTS_COLUMNS[1:])}}} : ({terms})"


def range_match(words: Sequence[str], op: str) -> str:
    """The FTS5 expression a recall runs within a scope's doc-id range: the words joined by `op`,
    double-quoted (FTS5 operators in user text stay inert).

    No scope token: the range alone keeps the match in the scope, and the token's own doclist (every
    document of the scope) would be walked beside the words'. No column filter unless a word is all
    digits: a column filter makes FTS5 read every position list of a word, here and in the count
    `bm25()` makes of the word's documents over the whole table, and only a word of digits can occur
    in the scope token column (weight 0). The BM25 scores are the same as with the token and the
    filter: a phrase found in no weighted column adds 0.
    """
    terms = f" {op} ".join(f'"{w}"' for w in words)
    if any(w.isdigit() for w in words):
        return f"{{{' '.join(FTS_COLUMNS[1:])}}} : ({terms})"
    return terms


def bm25_candidates(db: sqlite_utils.Database, words: Sequence[str], scopes: Sequence[str],
                    limit: int, candidates: int = CANDIDATES) -> list[Hit]:
    """BM25 candidates in `scopes`, AND of the words first, OR when AND finds fewer than `limit`
    (which a count that stops at the `limit`-th match tells before the AND is ranked).

    Each scope is searched within its own doc-id range (`rowid BETWEEN`, which FTS5 seeks to), and the
    joined row's scope is checked once more. Returns the hits, best first: rank (BM25 with
    BM25_WEIGHTS, configured as the table's rank), then recency, then id.

    At most `candidates` hits: the best `candidates` of the order above (a prefix of it, whatever the
    number), so a recall ranked by BM25 alone asks for `limit` and skips the other 200 - `limit`.
    Only the matches ranked up to the `candidates`-th rank (the ties at it included, as recency
    orders them) are joined to their document: a scope's common words match tens of thousands.
    """
    ranges = scope_ranges(db, scopes)
    any_word = range_match(words, "OR")
    plans = [range_match(words, "AND"), any_word] if len(words) > 1 else [any_word]
    rows: list[Any] = []
    for match in plans:
        if match is not any_word and (candidates < limit or not _matches_at_least(db, match, ranges, limit)):
            continue  # the AND cannot give `limit` candidates: not ranked (its BM25 counts every word's documents)
        rows = []
        for scope, low, high in ranges:
            rows += _ranked_in_range(db, match, scope, low, high, int(candidates))
        if len(ranges) > 1:
            rows.sort(key=lambda r: (r[0], _desc(r[1]), r[2]))
            rows = rows[:candidates]
        if len(rows) >= limit:
            break
    return [Hit(r[2], int(r[3]), r[1], -float(r[0])) for r in rows]


def _matches_at_least(db: sqlite_utils.Database, match: str, ranges: Sequence[tuple[str, int, int]], n: int) -> bool:
    """Whether `match` has at least `n` documents in the ranges (stops at the n-th: no ranking)."""
    found = 0
    for _scope, low, high in ranges:
        if found >= n:
            break
        found += int(db.execute("SELECT count(*) FROM (SELECT 1 FROM builtin_fts WHERE builtin_fts MATCH ?"
                                " AND rowid BETWEEN ? AND ? LIMIT ?)", [match, low, high, n - found]).fetchone()[0])
    return found >= n


def _ranked_in_range(db: sqlite_utils.Database, match: str, scope: str, low: int, high: int,
                     candidates: int) -> list[Any]:
    """The best `candidates` (rank, started_at, episode_id, doc_id) of `match` in doc ids low..high.

    FTS5 ranks every match once (`m`); the `candidates`-th rank is the cut, and only the matches at
    or above it are joined to builtin_docs, for the recency that orders ties and the scope check.
    That check never drops a row the store wrote (a scope's doc ids are its own, `scope_doc_id`); it
    keeps a foreign row out, it does not make room for the next match."""
    return db.execute(
        "WITH m AS MATERIALIZED (SELECT rowid AS id, rank AS r FROM builtin_fts"
        " WHERE builtin_fts MATCH ? AND builtin_fts.rank MATCH ? AND rowid BETWEEN ? AND ?)"
        " SELECT m.r, d.started_at, d.episode_id, d.doc_id FROM m CROSS JOIN builtin_docs d ON d.doc_id = m.id"
        f" WHERE m.r <= coalesce((SELECT r FROM m ORDER BY r LIMIT 1 OFFSET {candidates - 1}), 1e308)"
        f" AND d.scope = ? ORDER BY m.r, d.started_at DESC, d.episode_id LIMIT {candidates}",
        [match, rank_function(), low, high, scope]).fetchall()


def scope_ranges(db: sqlite_utils.Database, scopes: Sequence[str]) -> list[tuple[str, int, int]]:
    """(scope, first doc id, last doc id) of each requested scope that has documents."""
    wanted = list(dict.fromkeys(scopes))
    nums = dict(db.execute(f"SELECT scope, num FROM builtin_scopes WHERE scope IN ({','.join('?' * len(wanted))})",
                           wanted).fetchall())
    return [(scope, *scope_range(int(nums[scope]))) for scope in wanted if scope in nums]


def _occurs(db: sqlite_utils.Database, match: str, ranges: Sequence[tuple[str, int, int]]) -> bool:
    return any(db.execute("SELECT 1 FROM builtin_fts WHERE builtin_fts MATCH ? AND rowid BETWEEN ? AND ? LIMIT 1",
                          [match, low, high]).fetchone() is not None for _, low, high in ranges)


#: Most (scope, word) pairs a caller's `absent` map keeps in `metadata_only` (then it starts again from none).
META_ABSENT_KEPT = 8192


def metadata_only(db: sqlite_utils.Database, words: Sequence[str], scopes: Sequence[str],
                  absent: MutableMapping[tuple[str, int, str], int] | None = None) -> bool:
    """Whether a query's words only select the scope's episodes (REQ-14's briefing query: repository,
    branch and harness name): each word occurs in the `meta` column of an episode of the scope or in
    none of its episodes at all, and one at least in `meta`. A word found in what a run said or touched
    and not in any metadata makes it a real query. At most two index probes per word.

    `absent` (the built-in provider's, one per store) remembers up to which document of a scope a word
    is in no episode's metadata, so the next query with that word probes only the documents written
    since. The probe that finds nothing is the dear one (`meta : "w"` walks every occurrence of a word
    the scope's runs say often, ~0.4-1 ms at 10k; one that finds the word stops at once), and what it
    proves stays true: a document's metadata never changes in place (a re-recorded episode is a new
    document with a higher doc id: `put_doc`), and a forgotten one only takes words away. It maps
    (scope, scope number, word) to the highest doc id already shown not to hold the word in `meta`; it
    is shared by the store's reader threads, so it is only read, set and cleared, never iterated."""
    nums = scope_numbers(db, scopes)
    if not nums or not words:
        return False
    absent = {} if absent is None else absent
    content = "{" + " ".join(CONTENT_COLUMNS) + "}"
    in_meta = False
    # The answer does not depend on the words' order (False as soon as one word is in what a run said
    # and in no metadata; else whether any is in metadata), so the words already known to be in no
    # metadata go first: a question sharing one word with an earlier one is told apart by that word's
    # content probe, which stops at its first match.
    known = [w for w in words if all(absent.get((scope, num, w), -1) >= last for scope, (num, last) in nums.items())]
    for w in [*known, *(w for w in words if w not in known)]:
        found = False
        for scope, (num, last) in nums.items():
            low, high = scope_range(num)
            key = (scope, num, w)
            checked = absent.get(key, low - 1)
            if checked < last and _occurs(db, f'meta : "{w}"', [(scope, checked + 1, high)]):
                found = True
                break
            if len(absent) >= META_ABSENT_KEPT:
                absent.clear()
            absent[key] = last
        if found:
            in_meta = True
        elif _occurs(db, f'{content} : "{w}"', [(s, *scope_range(n)) for s, (n, _) in nums.items()]):
            return False
    return in_meta


def scope_numbers(db: sqlite_utils.Database, scopes: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(scope number, highest doc id ever given in it) of each requested scope that has documents."""
    wanted = list(dict.fromkeys(scopes))
    return {str(scope): (int(num), (int(num) << 32) | (int(seq) - 1)) for scope, num, seq in db.execute(
        f"SELECT scope, num, next_seq FROM builtin_scopes WHERE scope IN ({','.join('?' * len(wanted))})",
        wanted).fetchall()}


#: Episodes of the scope considered for a metadata-only query (newest first), and of the query's harness.
BRIEFING_CANDIDATES = 200
#: The query harness's newest runs that say which files it edits most, and among which its own picks
#: are ranked by how much of those files they touched.
HARNESS_RUNS = 50
#: How many of the files a harness edits most count as its ground.
HARNESS_FILES = 10

_BRIEFING_COLUMNS = "doc_id, episode_id, started_at, branch, outcome, files, harness"


def briefing_order(db: sqlite_utils.Database, words: Sequence[str], scopes: Sequence[str]) -> list[Hit]:
    """A metadata-only query's answer (see `metadata_only`), ordered by what helps the next run of the
    query's harness instead of BM25 (which, every episode matching alike, preferred the shortest:
    "fix typo"): `briefing_rank` over the scope's newest BRIEFING_CANDIDATES episodes that have
    something to show (an excerpt or a file; a run that wrote nothing and touched nothing is left out)
    and, when fewer than HARNESS_RUNS of them are the query's harness's (`briefing_harness`), its newest
    BRIEFING_CANDIDATES however old."""
    ranges = scope_ranges(db, scopes)
    rows: list[Sequence[Any]] = []
    for scope, _low, _high in ranges:
        rows += db.execute(
            f"SELECT {_BRIEFING_COLUMNS} FROM builtin_docs WHERE scope = ? AND (excerpt != '' OR files != '[]')"
            f" ORDER BY started_at DESC, episode_id LIMIT {BRIEFING_CANDIDATES}", [scope]).fetchall()
    # The harnesses of the newest runs first; only when none fits, every harness of the scope.
    harnesses = briefing_harness(words, [r[6] for r in rows]) or briefing_harness(words, [
        r[0] for scope, _low, _high in ranges
        for r in db.execute("SELECT DISTINCT harness FROM builtin_docs WHERE scope = ?", [scope]).fetchall()])
    if harnesses and sum(r[6] in harnesses for r in rows) < HARNESS_RUNS:  # else its newest are all here
        marks = ",".join("?" * len(harnesses))
        for scope, _low, _high in ranges:
            rows += db.execute(
                f"SELECT {_BRIEFING_COLUMNS} FROM builtin_docs WHERE scope = ? AND harness IN ({marks})"
                f" AND (excerpt != '' OR files != '[]') ORDER BY started_at DESC, episode_id"
                f" LIMIT {BRIEFING_CANDIDATES}", [scope, *sorted(harnesses)]).fetchall()
    return briefing_rank(rows, words, harnesses)


def names_scope(words: Sequence[str], scopes: Sequence[str]) -> bool:
    """Whether a query's words begin with the words of one of the requested scopes' repository (a
    ``project:<repository>`` scope): REQ-14's briefing query, repository then branch and harness name.
    It is a metadata-only query however common the words of its branch or harness are (a
    harness named `docs` or `test-fixer`, whose name is also a word of many commits, had turned the briefing
    into a text search that served 800th-newest commits, or nothing above the relevance floor)."""
    for scope in scopes:
        if scope.startswith("project:"):
            repo = search_words(scope.removeprefix("project:"))
            if repo and list(words[:len(repo)]) == repo:
                return True
    return False


def briefing_harness(words: Sequence[str], names: Sequence[str]) -> frozenset[str]:
    """The harness a metadata-only query names (REQ-14's query: repository, branch and harness name),
    among the scope's harness `names`: one whose every word (less STOPWORDS) is a word of the query,
    the one with the most words when several are (`api-fixer` over `api` in `acme/api`); none when no
    name fits (a harness with no episodes yet)."""
    wanted = set(words)
    fits = {n: set(search_words(n)) for n in dict.fromkeys(names) if n}
    fits = {n: w for n, w in fits.items() if w and w <= wanted}
    most = max((len(w) for w in fits.values()), default=0)
    return frozenset(n for n, w in fits.items() if len(w) == most)


def briefing_rank(rows: Sequence[Sequence[Any]], words: Sequence[str],
                  harnesses: frozenset[str] = frozenset()) -> list[Hit]:
    """`briefing_order`'s ranking, given rows (doc_id, episode_id, started_at, branch, outcome, files as
    JSON, harness); every store engine uses it. The harness counts, so two harnesses of one
    repository get different picks, each what its next runs will need.

    1. The query harness's own runs on the query's branch (every word of their branch is a word of the
       query; any branch when no episode is on the query's branch), fused by reciprocal rank fusion
       (k = 60) of: newest first; and by how much of the files it edits most they touched (the
       HARNESS_FILES files most often in its HARNESS_RUNS newest runs, each weighing the number of
       those runs that touched it), among its HARNESS_RUNS newest here.
    2. Then the runs that fixed what failed — a run that succeeded after a failed run of the scope
       touching one of the same files —, newest first, that touched one of those files.
    3. Then the scope's order without a harness (the older order): RRF of the scope's newest
       BRIEFING_CANDIDATES newest first, those on the query's branch newest first, and those that fixed
       what failed newest first. It is all there is for a query naming no harness of the scope.
    Ties by recency, then id.
    """
    unique = {r[1]: r for r in rows}
    # Newest first, then by id: two stable sorts (a reversed sort keeps equal items in their order).
    rows = sorted(sorted(unique.values(), key=lambda r: r[1]), key=lambda r: r[2], reverse=True)
    started = {r[1]: r[2] for r in rows}
    files = {r[1]: set(json.loads(r[5])) for r in rows}
    wanted = set(words)

    def on_branch(r: Sequence[Any]) -> bool:
        return bool(r[3]) and set(WORD.findall(r[3].lower())) <= wanted

    branched = {r[1] for r in rows if on_branch(r)}
    failed_files: set[str] = set()
    fixed: list[str] = []
    for r in reversed(rows):  # oldest first
        if r[4] == "failed":
            failed_files |= files[r[1]]
        elif r[4] == "succeeded" and files[r[1]] & failed_files:
            fixed.append(r[1])
            failed_files -= files[r[1]]
    fixed.reverse()
    newest = [r[1] for r in rows[:BRIEFING_CANDIDATES]]  # the scope's newest (the harness's older ones after)
    kept = set(newest)
    base = rrf([r for r in (newest, [e for e in newest if e in branched], [e for e in fixed if e in kept]) if r])
    order = rank(base, started, len(base))
    own = [r[1] for r in rows if len(r) >= 7 and r[6] in harnesses]
    if not own:
        return [_hit(unique[eid]) for eid in order]
    here = [e for e in own if e in branched] if branched else own
    counts = Counter(f for e in own[:HARNESS_RUNS] for f in files[e])
    ground = {f for f, _ in counts.most_common(HARNESS_FILES)}
    weight = {e: sum(counts[f] for f in files[e] & ground) for e in here[:HARNESS_RUNS]}
    by_ground = [e for e in sorted(weight, key=lambda e: -weight[e]) if weight[e] > 0]  # stable: newest first
    mine = rank(rrf([r for r in (here, by_ground) if r]), started, len(here))
    fixes = [e for e in fixed if files[e] & ground]
    return [_hit(unique[eid]) for eid in dict.fromkeys([*mine, *fixes, *order])]


def _hit(row: Sequence[Any]) -> Hit:
    return Hit(row[1], int(row[0]), row[2])


def path_candidates(db: sqlite_utils.Database, paths: Sequence[str], scopes: Sequence[str],
                    among: Sequence[int] = ()) -> list[Hit]:
    """Episodes in `scopes` whose `files_touched` holds one of `paths` exactly (repository-relative),
    newest first: the newest CANDIDATES of them, and any of the documents `among` (the text ranking's
    candidates) that touched one, however old."""
    conds = " OR ".join("EXISTS (SELECT 1 FROM json_each(d.files) WHERE value = ?)" for _ in paths)
    rows: list[Any] = []
    complete = True  # every episode that touched a path is in `rows` already
    for scope, _low, _high in scope_ranges(db, scopes):
        found = db.execute(
            f"SELECT d.episode_id, d.doc_id, d.started_at FROM builtin_docs d WHERE d.scope = ? AND ({conds})"
            f" ORDER BY d.started_at DESC, d.episode_id LIMIT {CANDIDATES}", [scope, *paths]).fetchall()
        complete = complete and len(found) < CANDIDATES
        rows += found
    have = {int(r[1]) for r in rows}
    wanted = [] if complete else [i for i in dict.fromkeys(among) if i not in have]
    for i in range(0, len(wanted), 500):
        chunk = wanted[i:i + 500]
        rows += db.execute(
            f"SELECT d.episode_id, d.doc_id, d.started_at FROM builtin_docs d"
            f" WHERE d.doc_id IN ({','.join('?' * len(chunk))}) AND d.scope IN ({','.join('?' * len(scopes))})"
            f" AND ({conds})", [*chunk, *scopes, *paths]).fetchall()
    hits = {r[0]: Hit(r[0], int(r[1]), r[2]) for r in rows}
    return sorted(hits.values(), key=lambda h: (_desc(h.started_at), h.episode_id))


def path_ranking(touched: Sequence[Hit], text_score: Mapping[str, float]) -> dict[str, int]:
    """REQ-11's path ranking (episode id → rank from 1) of the episodes that touched a requested path
    (`touched`, newest first): newest first, and among runs of the same start time the better text
    match (`text_score`, the fused text and cosine score) first.

    The recency of the runs that touched a path is what an agent about to edit it needs (the
    most recent runs that touched the paths are the relevant ones), so with `paths` this ranking is
    decisive and the text only breaks ties. Ordering text matches first (as it once did) in a
    repository where most runs touch one file gave old text matches the first places (path MRR 0.52 →
    0.30 in outsiders' measure).
    """
    order = sorted(touched, key=lambda h: (_desc(h.started_at), -text_score.get(h.episode_id, 0.0), h.episode_id))
    return {h.episode_id: i for i, h in enumerate(order, start=1)}


def rrf(rankings: Sequence[Sequence[str] | Mapping[str, int]], k: int = RRF_K) -> dict[str, float]:
    """Reciprocal rank fusion: Σ 1 / (k + rank) over every ranking an id appears in. A ranking is a list
    of ids, best first (rank from 1), or a mapping of id to rank (`path_ranking`)."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        pairs = ranking.items() if isinstance(ranking, Mapping) else ((key, r) for r, key in enumerate(ranking, 1))
        for key, rank in pairs:
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
    return fused


#: Hybrid fusion, chosen by `bench/fusion_sweep.py` on the real histories of httpx, attrs and
#: black: each ranking gives its best FUSE_DEPTH; BM25's weight in the score blend (cosine's is 1 − it).
FUSE_DEPTH = 20
TEXT_WEIGHT = 0.4
#: BM25's first hit stays first when its score is at least this many times the second's: a question in
#: the run's own words (plain RRF let a middling item with a good cosine outrank it: own-words MRR
#: 1.000 → 0.938).
CONFIDENT = 1.3


def embedded_share(text: Sequence[Hit], embedded: Collection[str] | None) -> float:
    """The share (0–1) of the text ranking's best FUSE_DEPTH that have a vector (`embedded`; None: all
    of them): below 1 while the back-fill has not reached every candidate."""
    top = text[:FUSE_DEPTH]
    return 1.0 if embedded is None or not top else sum(h.episode_id in embedded for h in top) / len(top)


def fuse_hybrid(text: Sequence[Hit], cosine: Sequence[Hit],
                embedded: Collection[str] | None = None) -> dict[str, float]:
    """Hybrid recall's fused score (episode id → score in [0, 2]) of the text ranking's and the cosine
    ranking's hits (each best first, `Hit.score` higher is better).

    Each ranking's best FUSE_DEPTH scores are min-max normalised to [0, 1] (a ranking of one, or of
    equal scores, gives 1), and an episode's score is TEXT_WEIGHT × its text score + (1 − TEXT_WEIGHT)
    × its cosine score (0 where it is not in that list). When BM25 is confident — its first hit scores
    CONFIDENT times its second, or it has one hit — that hit's score is raised by 1, above every other.

    `embedded`, when given, holds the text hits that have a vector. While some of the text ranking's
    best FUSE_DEPTH have none (recorded, not yet back-filled: right after `runs ingest` or an import),
    every hit is ranked on the signals it has, and the cosine can only lift, never lower: a text hit's
    score is its text score, plus — when it has a vector and the cosine ranking puts it higher than the
    text ranking does — cosine_weight × (its cosine score − its text score), where cosine_weight is
    (1 − TEXT_WEIGHT) × the share of the text ranking's best FUSE_DEPTH that have a vector; a hit of
    the cosine ranking alone scores cosine_weight × its cosine score. With the missing cosine
    counted 0, recall on a half-embedded store fell below BM25 alone; with the blend below applied to
    the embedded few, an embedded BM25 first with a middling cosine fell below an unembedded second
    (own words 0.979, hard other words 0.143 against BM25's 1.000 / 0.154 right after ingest): the
    cosine ranking of the few episodes embedded so far, min-max normalised, says little about where
    the others stand. Every hit embedded: the weights above.

    Measured against REQ-11's RRF (k = 60) of the same two lists (bench/fusion_sweep.py, 266 questions
    through the built-in provider): every question set at or above BM25 alone, where RRF lost 6 points
    of own-words MRR; docs/contracts.md has the figures."""
    def normalised(hits: Sequence[Hit]) -> dict[str, float]:
        best = {h.episode_id: h.score for h in hits[:FUSE_DEPTH]}
        if not best:
            return {}
        low, high = min(best.values()), max(best.values())
        return {eid: (v - low) / (high - low) if high > low else 1.0 for eid, v in best.items()}

    t, c = normalised(text), normalised(cosine)
    share = embedded_share(text, embedded)
    cosine_weight = (1 - TEXT_WEIGHT) * share

    def blend(eid: str) -> float:
        if share < 1:  # while the back-fill runs: the text whole, the cosine a lift
            return t.get(eid, 0.0) + cosine_weight * max(0.0, c.get(eid, 0.0) - t.get(eid, 0.0))
        return (1 - cosine_weight) * t.get(eid, 0.0) + cosine_weight * c.get(eid, 0.0)

    fused = {eid: blend(eid) for eid in (*t, *c)}
    if text and (len(text) == 1 or (text[1].score > 0 and text[0].score >= CONFIDENT * text[1].score)):
        fused[text[0].episode_id] += 1.0
    return fused


#: One score scale: an item's score is its relevance in [0, 1], on every install (BM25 alone
#: or hybrid, SQLite or PostgreSQL), from absolute evidence only (never a min-max over the answer, which
#: made the best of nothing score 1): how much of the query's weight its text holds (`coverage`) and,
#: with a vector, how close the embedded model puts it and how close the answer comes at all
#: (`relevance_scores`). RELEVANCE_FLOOR is the score below which an item is not served, so a recall
#: can answer "nothing"; it was calibrated on questions with no answer in the store
#: (bench/data/noanswer_questions.json, bench/data/noanswer_heldout.json) and the answerable questions
#: of bench/recall_quality.py (docs/benchmarks.md, bench/floor_sweep.py).
RELEVANCE_FLOOR = 0.4
#: An item's own evidence with a vector (`item_logit`): a logistic model of five absolute measures,
#: fitted on the answers and the no-answer questions' items of bench/recall_quality.py
#: (bench/floor_sweep.py --fit): its `coverage`, its cosine similarity to the query, how far that
#: stands above the median of the cosine ranking's best FUSE_DEPTH (a match standing out from the
#: scope's other episodes), the idf share of the query's words that no episode of the scope holds
#: (`unknown_share`: a question about something the repository never saw), and the cosine ranking's
#: best similarity (how close the scope comes to the question at all). The logit is RELEVANCE_BIAS +
#: Σ weight × measure.
RELEVANCE_BIAS = -4.17
W_COVERAGE = 1.64
W_COSINE = 3.53
W_MARGIN = 4.91
W_UNKNOWN = -3.69
W_BEST = 3.87
#: How much of an item's score is the answer's: the logit served is
#: (1 − ANSWER_WEIGHT) × the item's own + ANSWER_WEIGHT × the best item's of the answer. Whether a
#: question has an answer in the store at all is told better by the answer's best candidate than by
#: each item alone (a weaker third item of a clear answer is worth showing; a fair-looking item of a
#: question the repository cannot answer is not), and the item's own half keeps an unrelated episode
#: out of a clear answer. bench/floor_sweep.py --fit: at 80–85 % of the no-answer questions answered
#: with nothing, 0.01 more MRR than items judged alone.
ANSWER_WEIGHT = 0.5
#: Text evidence of an episode known by its text alone (BM25-only installs; an episode whose vector
#: is not back-filled yet): its `coverage` over TEXT_SURE.
TEXT_SURE = 0.45


@attrs.frozen
class Evidence:
    """What the store says about the query's words and the candidates (`DocIndex.evidence`): how many
    documents the scopes hold, how many hold each word (`df`; a word the engine cannot search, a
    PostgreSQL stop word, is absent), the words each candidate holds, and which candidates have a
    vector."""

    docs: int
    df: Mapping[str, int]
    present: Mapping[int, frozenset[str]]
    vectored: frozenset[int] = frozenset()


def idf(docs: int, df: int) -> float:
    """BM25's inverse document frequency (never negative): a word few documents hold weighs most."""
    return math.log(1.0 + (docs - df + 0.5) / (df + 0.5))


def coverage(evidence: Evidence) -> dict[int, float]:
    """Each candidate's share (0–1) of the query's weight: Σ idf of the words it holds / Σ idf of every
    searchable word of the query. A word no document holds weighs most, so a question about something
    the store never saw stays uncovered whatever else it shares with an episode."""
    weights = {w: idf(evidence.docs, n) for w, n in evidence.df.items()}
    total = sum(weights.values())
    if total <= 0:
        return {doc: 0.0 for doc in evidence.present}
    return {doc: min(1.0, sum(weights.get(w, 0.0) for w in words) / total)
            for doc, words in evidence.present.items()}


#: How many documents a scope holds before a word none of them holds counts whole in `unknown_share`.
UNKNOWN_DOCS = 1000


def unknown_share(evidence: Evidence) -> float:
    """The idf-weighted share (0–1) of the query's searchable words that no document of the scopes
    holds: a question whose key words never occur in the repository has no answer by words. Scaled by
    the scopes' size up to UNKNOWN_DOCS documents: a word a thousand episodes never say tells that the
    repository never saw it; one that a new repository's three episodes lack tells little (the model
    was fitted on scopes of 1,451 to 2,282 episodes, where the scale is 1)."""
    weights = {w: idf(evidence.docs, n) for w, n in evidence.df.items()}
    total = sum(weights.values())
    if total <= 0:
        return 0.0
    return min(1.0, evidence.docs / UNKNOWN_DOCS) * sum(v for w, v in weights.items() if evidence.df[w] == 0) / total


def _others(cosines: Sequence[float], own: float) -> Sequence[float]:
    """The cosine ranking's similarities without the item's own (one occurrence): the background its
    margin is measured against. In a scope of two or three candidates the median with the item's own
    similarity in it is half the item itself (a new repository's one match by meaning scored below the
    floor for standing out from nothing but itself); in a scope of FUSE_DEPTH it moves the median by
    half a place. A lone candidate has no background: its margin is 0."""
    others = list(cosines)
    if own in others and len(others) > 1:
        others.remove(own)
    return others


def text_relevance(covered: float) -> float:
    """The score of an episode known by its text alone (0–1): `covered` / TEXT_SURE, at most 1. With no
    cosine to vouch for or against it, fewer of the words must match."""
    return min(1.0, covered / TEXT_SURE)


def item_logit(covered: float, cosine: float | None, cosines: Sequence[float], unknown: float) -> float:
    """An item's own evidence with a vector, as a logit: RELEVANCE_BIAS + W_COVERAGE × covered +
    W_COSINE × cosine + W_MARGIN × (cosine − median of the other best FUSE_DEPTH cosines) + W_UNKNOWN ×
    unknown + W_BEST × the best cosine. `cosine` is None for an episode below the cosine ranking's
    candidates `cosines` (best first, not empty): it counts their last similarity, the most it can
    have."""
    similarity = cosines[-1] if cosine is None else cosine
    margin = similarity - statistics.median(_others(cosines[:FUSE_DEPTH], similarity))
    return (RELEVANCE_BIAS + W_COVERAGE * covered + W_COSINE * similarity + W_MARGIN * margin
            + W_UNKNOWN * unknown + W_BEST * cosines[0])


def relevance_scores(hits: Mapping[str, Hit], evidence: Evidence, cosine: Sequence[Hit],
                     candidates: Collection[str], *, filling: bool = False) -> dict[str, float]:
    """Each hit's score on the one scale (episode id → 0–1; RELEVANCE_FLOOR and up is served).

    `hits` are the answer's episodes (the text and the cosine rankings' and any other), `evidence` the
    words' (`DocIndex.evidence`, with `vectored`), `cosine` the cosine ranking (best first; empty on a
    BM25-only install or for a metadata-only query), `candidates` the ids the fusion ranked (the
    answer's best candidates, whose best item speaks for the answer), `filling` whether some of the text
    ranking's best have no vector yet (`embedded_share` below 1: the back-fill is running).

    * An episode without a vector, or any episode when there is no cosine ranking: `text_relevance`.
    * An episode with a vector: the logistic of (1 − ANSWER_WEIGHT) × its `item_logit` + ANSWER_WEIGHT ×
      the best `item_logit` among the `candidates` with a vector. While `filling`, at least its
      `text_relevance`: the cosine ranking of the few episodes embedded so far (its best similarity, its
      median) does not stand for the scope, and an item is served on the signal it has, as on BM25
      alone (judged by the few, it fell below BM25 right after ingest)."""
    covered = coverage(evidence)
    cosines = [h.score for h in cosine]
    if not cosines:
        return {eid: text_relevance(covered.get(h.doc_id, 0.0)) for eid, h in hits.items()}
    unknown = unknown_share(evidence)
    similarity = {h.episode_id: h.score for h in cosine}
    own = {eid: item_logit(covered.get(h.doc_id, 0.0), similarity.get(eid), cosines, unknown)
           for eid, h in hits.items() if eid in similarity or h.doc_id in evidence.vectored}
    answer = max((own[eid] for eid in candidates if eid in own), default=None)
    scores = {}
    for eid, h in hits.items():
        text = text_relevance(covered.get(h.doc_id, 0.0))
        if eid not in own:
            scores[eid] = text
            continue
        logit = own[eid] if answer is None else (1 - ANSWER_WEIGHT) * own[eid] + ANSWER_WEIGHT * answer
        score = 1.0 / (1.0 + math.exp(-logit))
        scores[eid] = max(score, text) if filling else score
    return scores


def rank(fused: dict[str, float], started: dict[str, str], limit: int) -> list[str]:
    """Ids by fused score, ties by recency (started_at newest first), then id."""
    by_id = sorted(fused)
    by_recency = sorted(by_id, key=lambda eid: started.get(eid, ""), reverse=True)  # stable: id order kept
    return sorted(by_recency, key=lambda eid: -fused[eid])[:limit]


def _desc(started_at: str) -> tuple[int, ...]:
    """Sort key for 'newest first' on ISO strings."""
    return tuple(-ord(c) for c in started_at)


def closest_first(found: list[tuple[float, str, int, str]]) -> list[tuple[float, str, int, str]]:
    """(distance, episode id, doc id, started_at) rows by distance, ties newest first, then by episode id:
    the order `knn` has always had. The recency key (`ranking._desc`, one int per character) is built
    only for the rows that tie on distance (a retried task's copies), not for all ~200 of a scope: it
    was a quarter of `knn`'s Python time per recall."""
    found.sort(key=itemgetter(0))
    out: list[tuple[float, str, int, str]] = []
    for _, tied in groupby(found, key=itemgetter(0)):
        group = list(tied)
        if len(group) > 1:
            group.sort(key=lambda r: (_desc(r[3]), r[1]))
        out += group
    return out
