"""The read path made cheaper must answer exactly what it answered before (REQ-11, REQ-3).

Each test here pins a behaviour-bearing change of the recall path against the straightforward form it
replaced: item texts composed for all hits at once against the gist of each hit's own stored fields
(the gist replaced FTS5 snippets), the fast schema check against jsonschema's own verdict and
messages.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pytest
import sqlite_utils
import trio

from memactors.actors.index import text_belongs
from memactors.builtin import MAX_ITEM_TEXT, BuiltinProvider, Hit, bm25_candidates, item_texts, query_words
from memactors.documents import gist
from memactors.store import Store, scope_key

pytestmark = pytest.mark.req11

SCOPES = [f"project:forge.example/acme/r{n}" for n in range(4)]
WORDS = ["ledger", "rounding", "flaky", "cache", "retry", "socket", "parser", "schema", "token", "merge",
         "branch", "deploy", "timeout", "worker", "queue", "index", "vector", "commit", "rebase", "lint"]


def per_hit_item_texts(db: sqlite_utils.Database, hits: Sequence[Hit], words: Sequence[str]) -> dict[str, str]:
    """Each hit's gist from its own row, one statement per hit."""
    out: dict[str, str] = {}
    for hit in hits:
        row = db.execute("SELECT summary, excerpt, files, failures FROM builtin_docs WHERE doc_id = ?",
                         [hit.doc_id]).fetchone()
        if row is None:
            continue
        body = {"summary": row[0], "result_excerpt": row[1], "files_touched": json.loads(row[2]),
                "verify_failures": json.loads(row[3])}
        out[hit.episode_id] = gist(body, words, MAX_ITEM_TEXT)
    return out


async def _fill(provider: BuiltinProvider, rng: random.Random, n: int) -> dict[str, str]:
    texts = {}
    for i in range(n):
        scope = SCOPES[i % len(SCOPES)]
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 200)))
        files = [f"src/{rng.choice(WORDS)}.py" for _ in range(rng.randint(0, 3))]
        text = "".join(f"{k}: {v}\n" for k, v in (
            ("harness", f"h{i % 7}"), ("branch", "main"), ("outcome", rng.choice(("failed", "succeeded"))),
            ("files_touched", ", ".join(files)), ("verify_failures", "test_failure: 2" if i % 3 else ""),
            ("result_excerpt", body)))
        summary = " ".join(rng.choice(WORDS) for _ in range(8)) if i % 5 == 0 else None
        texts[f"ep_{i:03d}"] = text + f"summary: {summary or ''}\n"
        await provider.record({"episode_id": f"ep_{i:03d}", "scope": scope, "trust_class": "standard", "text": text,
                               "episode": {"started_at": f"2026-11-{1 + i % 28:02d}T09:00:00Z",
                                           "files_touched": files, "summary": summary}})
    return texts


async def test_item_texts_are_each_hits_gist_and_only_its_own_words(store: Store) -> None:
    """Whole answers of the provider (text-only and path-boosted, one and two scopes): every item's text
    is the gist of its own stored fields for the query's words, and passes REQ-9's text check against
    the rendering it was recorded with."""
    rng = random.Random(13)
    provider = BuiltinProvider(store)
    texts = await _fill(provider, rng, 120)
    checked = with_snippet = 0
    for _ in range(40):
        scopes = rng.sample(SCOPES, rng.choice((1, 2)))
        args: dict[str, Any] = {"query": " ".join(rng.sample(WORDS, rng.choice((1, 2, 3)))), "scope": scopes,
                                "limit": rng.choice((3, 8, 20))}
        if rng.random() < 0.5:
            args["paths"] = [f"src/{rng.choice(WORDS)}.py"]
        out = await provider.recall(args)
        words = query_words(args["query"])

        def recompute(db: sqlite_utils.Database, out: dict[str, Any] = out,
                      words: list[str] = words) -> dict[str, str]:
            hits = [Hit(str(r[0]), int(r[1]), str(r[2])) for r in db.execute(
                f"SELECT episode_id, doc_id, started_at FROM builtin_docs WHERE episode_id IN"
                f" ({','.join('?' * len(out['items']))})", [i["id"] for i in out["items"]])]
            return per_hit_item_texts(db, hits, words)

        got = {i["id"]: i["text"] for i in out["items"]}
        assert got == await store.read(recompute)
        for eid, text in got.items():
            assert text_belongs(text, texts[eid]), text
            assert len(text) <= MAX_ITEM_TEXT
        checked += len(got)
        with_snippet += sum("…" in t for t in got.values())
    assert checked > 150 and with_snippet > 30  # long excerpts were cut and snippets shown, not only summaries


async def test_item_texts_with_no_words_and_unknown_docs(store: Store) -> None:
    """A recall without words (paths only) composes gists without a snippet; a hit whose row is gone is skipped."""
    provider = BuiltinProvider(store)
    await _fill(provider, random.Random(9), 12)

    def both(db: sqlite_utils.Database) -> tuple[dict[str, str], dict[str, str]]:
        hits = [Hit(str(r[0]), int(r[1]), str(r[2])) for r in db.execute(
            "SELECT episode_id, doc_id, started_at FROM builtin_docs")]
        hits.append(Hit("ep_gone", 999, ""))
        return item_texts(db, hits, ()), per_hit_item_texts(db, hits, ())

    batched, per_hit = await store.read(both)
    assert batched == per_hit and len(batched) == 12 and "ep_gone" not in batched


# -- schema checks: the compiled fast path gives jsonschema's verdict and message ----------------------

_ITEM = {"id": "ep_1", "text": "t", "score": 0.5}
SCHEMA_CASES: list[tuple[str, Any]] = [
    ("memory_recall.input", {"query": "q", "scope": ["project:a"], "limit": 8}),
    ("memory_recall.input", {"query": "q", "scope": ["project:a", "project:b"], "limit": 20, "paths": ["src/a.py"]}),
    ("memory_recall.input", {"query": "q", "scope": ("project:a",), "limit": 8}),  # a tuple is not an array
    ("memory_recall.input", {"query": "q", "scope": [], "limit": 8}),
    ("memory_recall.input", {"query": "q", "scope": ["project:a"], "limit": 8.0}),
    ("memory_recall.input", {"query": "q", "scope": ["project:a"], "limit": True}),
    ("memory_recall.input", {"query": "q", "scope": ["project:a"], "limit": 2**70}),
    ("memory_recall.input", {"query": "q", "scope": ["project:a"]}),
    ("memory_recall.input", {"query": "q", "scope": ["project:a"], "limit": 8, "extra": 1}),
    ("memory_recall.input", {"query": "😀" * 400, "scope": ["project:a"], "limit": 8}),
    ("memory_recall.input", {"query": "x" * 513, "scope": ["project:a"], "limit": 8}),
    ("memory_recall.input", {"query": "q", "scope": [""], "limit": 8}),
    ("memory_recall.output", {"items": [_ITEM] * 8}),
    ("memory_recall.output", {"items": [_ITEM], "degraded": "embeddings_unavailable"}),
    ("memory_recall.output", {"items": [{**_ITEM, "score": float("nan")}]}),  # valid for the schema
    ("memory_recall.output", {"items": [{**_ITEM, "score": float("inf")}]}),
    ("memory_recall.output", {"items": [{**_ITEM, "score": None}]}),
    ("memory_recall.output", {"items": [{**_ITEM, "score": "high"}]}),
    ("memory_recall.output", {"items": ({"id": "a", "text": "b"},)}),
    ("memory_recall.output", {"items": [{"id": 1, "text": "b"}]}),
    ("memory_recall.output", {"items": [{"text": "b"}]}),
    ("memory_recall.output", {"items": [{"id": "a", "text": "b", 3: "x"}]}),
    ("memory_recall.output", {"degraded": 3}),
    ("memory_contract.output", {"contract": 1, "provider": {"name": "p", "version": "1"}}),
    ("memory_contract.output", {"contract": "1", "provider": {"name": "p", "version": "1"}}),
    ("memory_record_episode.output", {"ids": ["a"]}),
    ("memory_record_episode.output", {"ids": "a"}),
    ("memory_forget.output", {"forgotten": True}),
    ("memory_forget.output", {"forgotten": 1}),
]


@pytest.mark.parametrize(("name", "instance"), SCHEMA_CASES)
def test_the_fast_schema_check_gives_jsonschemas_verdict_and_error(name: str, instance: Any) -> None:
    from memactors import contract

    expected = contract._first_error(contract._validator(name), instance)
    got = contract._schema_error(name, instance)
    assert (got is None) == (expected is None)
    if expected is not None:
        assert got is not None
        assert (contract._field_path(got), got.validator) == (contract._field_path(expected), expected.validator)


def test_check_request_and_validate_response_still_name_the_field() -> None:
    from memactors import contract
    from memactors.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"memory_recall request is invalid at scope \(type\)"):
        contract.check_request("memory_recall", {"query": "q", "scope": ("project:a",), "limit": 8})
    with pytest.raises(InvalidArgument, match=r"memory_recall request is invalid at extra \(additionalProperties\)"):
        contract.check_request("memory_recall", {"query": "q", "scope": ["project:a"], "limit": 8, "extra": 1})
    with pytest.raises(contract.ProviderSchemaError, match=r"fails its schema at items\[0\]\.id \(type\)"):
        contract.validate_response("memory_recall", {"items": [{"id": 1, "text": "b"}]}, provider="p")
    nan = {"items": [{"id": "a", "text": "b", "score": float("nan")}]}
    assert contract.validate_response("memory_recall", nan, provider="p") is nan  # dropped per item, later


# -- BM25 alone asks for `limit` candidates: the same answer as 200 -----------------------------------

async def test_bm25_candidates_for_limit_are_the_prefix_of_the_200(store: Store) -> None:
    rng = random.Random(17)
    await _fill(BuiltinProvider(store), rng, 160)
    for _ in range(40):
        scopes = rng.sample(SCOPES, rng.choice((1, 2)))
        words = query_words(" ".join(rng.sample(WORDS, rng.choice((1, 2, 3)))))
        limit = rng.choice((1, 3, 8, 20))

        def both(db: sqlite_utils.Database, words: list[str] = words, scopes: list[str] = scopes,
                 limit: int = limit) -> tuple[list[Hit], list[Hit]]:
            return bm25_candidates(db, words, scopes, limit), bm25_candidates(db, words, scopes, limit, limit)

        full, short = await store.read(both)
        assert short == full[:limit] and short


def table_wide_candidates(db: sqlite_utils.Database, words: list[str], scopes: list[str], limit: int,
                          candidates: int) -> list[Hit]:
    """The plan bm25_candidates replaced: the whole table matched with the scopes' tokens and the words in
    the text columns, every match joined to its document, ordered by rank, recency, id."""
    from memactors.builtin.ranking import rank_function, scoped_match

    rows: list[Any] = []
    for op in (["AND", "OR"] if len(words) > 1 else ["OR"]):
        rows = db.execute(
            "SELECT builtin_fts.rank, d.started_at, d.episode_id, d.doc_id FROM builtin_fts"
            " JOIN builtin_docs d ON d.doc_id = builtin_fts.rowid WHERE builtin_fts MATCH ? AND builtin_fts.rank MATCH ?"
            f" ORDER BY builtin_fts.rank, d.started_at DESC, d.episode_id LIMIT {candidates}",
            [scoped_match(words, scopes, op), rank_function()]).fetchall()
        if len(rows) >= limit:
            break
    return [Hit(r[2], int(r[3]), r[1], -float(r[0])) for r in rows]


async def test_bm25_candidates_are_the_table_wide_matches_with_the_same_scores_and_order(store: Store) -> None:
    """Searching each scope's doc-id range (no scope token, no column filter but for a word of digits),
    and joining only the matches up to the cut rank, answers what matching the whole table with the
    scopes' tokens answered: the same episodes, BM25 scores to the last bit, ties by recency."""
    rng = random.Random(29)
    await _fill(BuiltinProvider(store), rng, 160)
    compared = 0
    # "2" is in the failures column of two episodes in three, "h3" in meta (the harness), a scope's token
    # only in the scope token column (weight 0: never a match of the words)
    key = scope_key(SCOPES[0])
    asked = [([key], SCOPES[:1]), (["ledger", key], SCOPES[:2]), (["2"], SCOPES[:1])]
    for _ in range(60):
        asked.append((query_words(" ".join(rng.sample([*WORDS, "2", "h3", key], rng.choice((1, 2, 3))))),
                      rng.sample(SCOPES, rng.choice((1, 2)))))
    for words, scopes in asked:
        limit = rng.choice((1, 3, 8))
        candidates = rng.choice((limit, 5, 200))

        def both(db: sqlite_utils.Database, words: list[str] = words, scopes: list[str] = scopes, limit: int = limit,
                 candidates: int = candidates) -> tuple[list[Hit], list[Hit]]:
            return (bm25_candidates(db, words, scopes, limit, candidates),
                    table_wide_candidates(db, words, scopes, limit, candidates))

        got, want = await store.read(both)
        assert got == want
        compared += bool(want)
    assert compared > 40


# -- the gateway's caller: its view needs no second read ---------------------------------------------

async def test_the_view_of_a_token_is_read_in_one_hop(memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from support import example

    await memory.ingest_run(example("run-42-api-fixer.json"))  # run 42 of api-fixer worked in its repository
    placed = (await memory.mint_run_token(harness="api-fixer", run_id="42"))["token"]
    reads = 0
    real_read = memory.store.read
    me = trio.lowlevel.current_task()  # the service's own loops (retention, ...) read in other tasks

    async def counting_read(fn: Any) -> Any:
        nonlocal reads
        reads += trio.lowlevel.current_task() is me
        return await real_read(fn)

    monkeypatch.setattr(memory.store, "read", counting_read)
    view = await memory.caller_view(placed)
    assert reads == 1
    assert (view.harness, view.run_id, view.repo) == ("api-fixer", "42", "forge.example/acme/api")
    assert (await memory.caller_view("not-a-token")).kind == "unattributed"


# -- the wrapper's cheaper measures: the same sizes and nonce verdicts ------------------------------

@pytest.mark.req12
@pytest.mark.parametrize("text", ['plain', 'quote " back \\ slash', "line\nfeed\ttab\x01", "é 😀 \u2028", "\ud800 lone", ""])
def test_wire_size_is_json_dumps_size(text: str) -> None:
    import json

    from memactors.documents._fit import _wire_nbytes

    assert _wire_nbytes(text) == len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


@pytest.mark.req12
def test_a_nonce_found_in_any_one_string_is_refused_and_none_spans_two() -> None:
    from memactors.documents._model import _check_nonce
    from memactors.errors import InvalidArgument

    nonce = "0123456789abcdef"
    _check_nonce(nonce, ["01234567", "89abcdef"])  # the halves in two strings are not an occurrence
    with pytest.raises(InvalidArgument, match="nonce occurs"):
        _check_nonce(nonce, ["x", f"text {nonce} text"])
