"""SPEC-0030 REQ-11: the built-in provider — BM25, hybrid RRF with sqlite-vec, path boost, scope, forget."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp.types as t
import pytest
import trio
from sqlite_vec import serialize_float32

from memactors.builtin import RRF_K, BuiltinProvider, missing_vectors, rrf
from memactors.builtin.index_sqlite import as_floats, retire_vectors
from memactors.config import ConfigHolder
from memactors.modelapi import ModelApiClient, ModelApiError
from memactors.service import open_memory_service
from memactors.store import Store
from memactors.store.engines import open_store
from memactors.store.sqlite import READ_CONNECTIONS, _connect
from memactors.testing.fake_model_api import FakeModelApi
from support import RESIDENT, run_record, serving, wait_ready, within
from support_builtin import A, check_scored_hits
from support_builtin import episode_args as _args
from support_readside import as_run, gateway_client

pytestmark = pytest.mark.req11

B = "project:forge.example/acme/web"


async def _ids(provider: BuiltinProvider, query: str, scopes: list[str] = [A], **extra: Any) -> list[str]:  # noqa: B006
    out = await provider.recall({"query": query, "scope": scopes, "limit": 20, **extra})
    return [item["id"] for item in out["items"]]


@pytest.mark.both_engines
async def test_bm25_ranks_the_better_match_first(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_1", "refactored the billing module"))
    await p.record(_args("ep_2", "ledger test flaky; fixed the ledger rounding in the ledger"))
    await p.record(_args("ep_3", "ledger mentioned once"))
    assert await _ids(p, "ledger rounding") == ["ep_2", "ep_3"]


@pytest.mark.both_engines
async def test_the_summary_is_indexed_and_served_with_the_text(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_1", "long body", summary="Fixed the flaky ledger test."))
    out = await p.recall({"query": "flaky", "scope": [A], "limit": 5})
    assert out["items"][0]["id"] == "ep_1"
    assert out["items"][0]["text"].startswith("Fixed the flaky ledger test.")  # the run's own words lead
    assert "degraded" not in out


@pytest.mark.both_engines
async def test_recall_never_returns_another_scopes_episode(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_a", "ledger fix", scope=A, files=("src/ledger.py",)))
    await p.record(_args("ep_b", "ledger fix", scope=B, files=("src/ledger.py",)))
    assert await _ids(p, "ledger") == ["ep_a"]
    assert await _ids(p, "ledger", [B]) == ["ep_b"]
    assert await _ids(p, "nothing", [B], paths=["src/ledger.py"]) == ["ep_b"]
    assert sorted(await _ids(p, "ledger", [A, B])) == ["ep_a", "ep_b"]


@pytest.mark.both_engines
async def test_ties_break_by_recency_then_id(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_c", "nothing", started="2026-11-01T00:00:00Z", files=("a.py",)))
    await p.record(_args("ep_b", "nothing", started="2026-11-02T00:00:00Z", files=("b.py",)))
    await p.record(_args("ep_a", "nothing", started="2026-11-01T00:00:00Z", files=("c.py",)))
    # One path ranking, newest first then id; equal fused scores keep that order.
    assert await _ids(p, "zzz", paths=["a.py", "b.py", "c.py"]) == ["ep_b", "ep_a", "ep_c"]
    fused = rrf([["x", "y"], ["y", "x"]])
    assert fused["x"] == fused["y"] == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + 2))


@pytest.mark.both_engines
async def test_a_requested_path_boosts_the_episode_that_touched_it(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_1", "rounding rounding rounding cents", files=("src/other.py",)))
    await p.record(_args("ep_2", "rounding cents", files=("src/ledger.py",)))
    await p.record(_args("ep_3", "unrelated", files=("src/ledger.py",)))
    assert await _ids(p, "rounding") == ["ep_1", "ep_2"]
    # With the path: the path's episodes first (same start time: the text match breaks the tie), then
    # the other text match.
    assert await _ids(p, "rounding", paths=["src/ledger.py"]) == ["ep_2", "ep_3", "ep_1"]


@pytest.mark.both_engines
async def test_with_paths_the_newest_runs_that_touched_them_come_first_and_text_breaks_ties(store: Store) -> None:
    """An agent about to edit a path needs the most recent runs that touched it, so with
    `paths` the path ranking is decisive — newest first, the text match breaking ties — and the other
    text matches follow. (An earlier ranking ordered the path's text matches first: old runs then took the
    first places in a repository where most runs touch one file, and path MRR fell to 0.30.)"""
    p = BuiltinProvider(store)
    await p.record(_args("ep_hash", "Fix hashing of instances whose equality is customised",
                         started="2020-01-01T00:00:00Z", files=("src/make.py", "tests/test_make.py")))
    await p.record(_args("ep_eq", "Hashing docs: equality and hashing explained",
                         started="2020-02-01T00:00:00Z", files=("docs/hashing.rst",)))
    for i in range(12):  # newer runs on the same file about something else
        await p.record(_args(f"ep_new{i:02}", f"Refactor attribute collection step {i}",
                             started=f"2026-11-{i + 1:02}T00:00:00Z", files=("src/make.py",)))
    for tie in ("ep_tie_other", "ep_tie_hashing"):  # two runs of one start time: the text match first
        await p.record(_args(tie, "Hashing equality customised" if tie.endswith("hashing") else "Unrelated",
                             started="2026-11-20T00:00:00Z", files=("src/make.py",)))
    ids = await _ids(p, "hashing customised equality", paths=["src/make.py"])
    assert ids[:2] == ["ep_tie_hashing", "ep_tie_other"]
    assert ids[2:14] == [f"ep_new{i:02}" for i in range(11, -1, -1)]  # then the path's runs, newest first
    assert ids[14:] == ["ep_hash", "ep_eq"]  # its oldest, then the text match that did not touch it
    # Without the path the text ranking alone.
    assert (await _ids(p, "hashing customised equality"))[0] in {"ep_hash", "ep_tie_hashing"}


@pytest.mark.both_engines
async def test_recording_twice_returns_the_same_ids_and_forget_of_unknown_is_false(store: Store) -> None:
    p = BuiltinProvider(store)
    assert (await p.record(_args("ep_1", "ledger")))["ids"] == ["ep_1"]
    assert (await p.record(_args("ep_1", "ledger")))["ids"] == ["ep_1"]
    assert await _ids(p, "ledger") == ["ep_1"]
    assert await p.forget({"id": "ep_unknown"}) == {"forgotten": False}
    assert await p.forget({"id": "ep_1"}) == {"forgotten": True}
    assert await p.forget({"id": "ep_1"}) == {"forgotten": False}
    assert await _ids(p, "ledger") == []


async def test_hybrid_embeds_in_the_background_once_per_content_and_fuses_cosine(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    # No floor: the fusion's candidates, however weak (the fake model's cosines are not the embedded one's).
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed", relevance_floor=0.0)
    await p.record(_args("ep_1", "rounding error in invoices"))
    await p.record(_args("ep_2", "totally different words here"))
    assert bag_of_words_api.requests_to("/v1/embeddings") == []  # recording never waits for the model
    assert await store.read(missing_vectors) == 2
    assert await p.embed_pending() == 2
    assert len(bag_of_words_api.requests_to("/v1/embeddings")) == 1  # one batch
    await p.record(_args("ep_1", "rounding error in invoices"))  # same content: nothing to do
    await p.record(_args("ep_9", "rounding error in invoices"))  # same content, other episode: the cache
    assert await p.embed_pending() == 1
    assert len(bag_of_words_api.requests_to("/v1/embeddings")) == 1
    assert await store.read(missing_vectors) == 0
    rows = await store.read(lambda db: db.execute("SELECT count(*) FROM builtin_vec").fetchone()[0])
    assert rows == 3
    # BM25 matches only ep_2; the cosine ranking brings the rest.
    out = await p.recall({"query": "different words", "scope": [A], "limit": 5})
    assert out["items"][0]["id"] == "ep_2"
    assert "degraded" not in out
    # The cosine ranking alone also brings back episodes BM25 does not match at all.
    ids = [i["id"] for i in out["items"]]
    assert set(ids) == {"ep_1", "ep_2", "ep_9"}
    # Scope is a vec0 partition: nothing from another scope.
    assert (await p.recall({"query": "different words", "scope": [B], "limit": 5}))["items"] == []


class _TextRankedFirst:
    """A `DocIndex` that says when its text ranking has run (from the store read's thread)."""

    def __init__(self, index: Any) -> None:
        self._index = index
        self.ranked = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)

    def text_candidates(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._index.text_candidates(*args, **kwargs)
        finally:
            self.ranked.set()


async def test_a_new_query_embedded_only_after_its_text_ranking_is_still_fused_with_cosine_in_one_read(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    reads = 0
    real_read = store.read

    async def counted_read(fn: Callable[[Any], Any]) -> Any:
        nonlocal reads
        reads += 1
        return await real_read(fn)

    async def embed_after_the_text_ranking(texts: list[str]) -> list[list[float]]:
        await trio.to_thread.run_sync(index.ranked.wait, 30.0)  # the text ranking has run: its read waits
        return await embed_client.embed(texts)

    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed", relevance_floor=0.0,
                        query_embedder=embed_after_the_text_ranking)
    await p.record(_args("ep_1", "rounding error in invoices"))
    await p.record(_args("ep_2", "totally different words here"))
    assert await p.embed_pending() == 2
    assert (await p.vector_status())["pending"] == 0  # every episode has its vector (counted again)
    index = _TextRankedFirst(p.index)
    p.index = index
    monkeypatch.setattr(store, "read", counted_read)
    out = await p.recall({"query": "different words", "scope": [A], "limit": 5})
    assert index.ranked.is_set()
    assert "degraded" not in out
    assert {i["id"] for i in out["items"]} == {"ep_1", "ep_2"}  # ep_1 from the cosine ranking alone
    assert reads == 1  # the text ranking, the cosine ranking and the fusion: one read hop


async def test_recalls_waiting_for_their_query_vectors_leave_read_connections_to_other_reads(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    gate = trio.Event()  # the model answers no query until another read has been served
    ranked = 0
    all_ranked = trio.Event()

    def one_ranked() -> None:
        nonlocal ranked
        ranked += 1
        if ranked == READ_CONNECTIONS:
            all_ranked.set()

    class Counted(_TextRankedFirst):
        def text_candidates(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().text_candidates(*args, **kwargs)
            finally:
                trio.from_thread.run_sync(one_ranked)

    async def gated(texts: list[str]) -> list[list[float]]:
        await gate.wait()
        return await embed_client.embed(texts)

    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed", relevance_floor=0.0,
                        query_embedder=gated, query_embed_deadline=10.0)
    await p.record(_args("ep_1", "rounding error in invoices"))
    await p.record(_args("ep_2", "totally different words here"))
    assert await p.embed_pending() == 2
    assert (await p.vector_status())["pending"] == 0
    p.index = Counted(p.index)
    answers: list[dict[str, Any]] = []

    async def recall(n: int) -> None:
        answers.append(await p.recall({"query": f"different words {n}", "scope": [A], "limit": 5}))

    async with trio.open_nursery() as nursery:
        for n in range(READ_CONNECTIONS):  # as many new queries as the store has read connections
            nursery.start_soon(recall, n)
        await all_ranked.wait()
        # Their text rankings have run, their vectors are not there: another read is still served.
        assert await store.read(lambda db: db.execute("SELECT count(*) FROM builtin_docs").fetchone()[0]) == 2
        gate.set()
    assert [a.get("degraded") for a in answers] == [None] * READ_CONNECTIONS
    assert all({i["id"] for i in a["items"]} == {"ep_1", "ep_2"} for a in answers)


@pytest.mark.both_engines
async def test_req11_hybrid_recall_falls_back_to_text(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed")
    await p.record(_args("ep_1", "ledger rounding fixed"))
    await p.record(_args("ep_2", "something else entirely"))
    await p.embed_pending()
    bag_of_words_api.behaviour.embed_status = 503
    out = await p.recall({"query": "ledger", "scope": [A], "limit": 5})
    assert out["degraded"] == "embeddings_unavailable"
    assert [i["id"] for i in out["items"]] == ["ep_1"]  # FTS5 alone: no cosine-only hits


@pytest.mark.both_engines
async def test_a_slow_embedding_model_does_not_hold_up_recall(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient, trio_clock: trio.testing.MockClock) -> None:
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed", query_embed_deadline=0.2)
    await p.record(_args("ep_1", "ledger rounding fixed"))
    bag_of_words_api.behaviour.embed_delay = 30.0
    out, _ = await within(trio_clock, 0.2, lambda: p.recall({"query": "ledger", "scope": [A], "limit": 5}))
    assert out["degraded"] == "embeddings_unavailable"
    assert [i["id"] for i in out["items"]] == ["ep_1"]


# SQLite only: on PostgreSQL a vector needs pgvector, which these stores lack; the pgvector cluster's
# tests in test_store_pg.py (the ones on pgvector) cover that engine.
async def test_an_episode_whose_embedding_fails_is_kept_without_a_vector(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed")
    bag_of_words_api.behaviour.embed_status = 503
    assert (await p.record(_args("ep_1", "ledger rounding fixed")))["ids"] == ["ep_1"]
    with pytest.raises(ModelApiError):
        await p.embed_pending()
    assert await store.read(missing_vectors) == 1
    bag_of_words_api.behaviour.embed_status = 200
    assert await _ids(p, "ledger") == ["ep_1"]
    # The recall gave its candidate the vector it lacked (the model is back), so the next pass has
    # nothing left to do.
    assert await store.read(missing_vectors) == 0
    assert await p.embed_pending() == 0


async def test_a_failed_embedding_pass_ends_the_wait_for_vectors_with_what_is_still_missing(
        make_holder: Callable[[str], ConfigHolder], bag_of_words_api: FakeModelApi,
        trio_clock: trio.testing.MockClock) -> None:
    """While the model is down the back-fill waits to try again; whoever waits for a pass (a bench, an
    operator's `--wait-vectors`) is told what is still missing instead of waiting for the model."""
    holder = make_holder(f'[model_api]\nbase_url = "{bag_of_words_api.base_url}"\nembedding_model = "fake-embed"\n')
    bag_of_words_api.behaviour.embed_status = 503
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        assert (await memory.ingest_run(run_record()))["outcome"] == "recorded"
        missing, _ = await within(trio_clock, 1, memory.builtin.wait_embedded)
        assert missing == 1
        assert memory.builtin.embed_stats["failed_batches"] >= 1


# SQLite only: on PostgreSQL a vector needs pgvector, which these stores lack; the pgvector cluster's
# tests in test_store_pg.py (the ones on pgvector) cover that engine.
async def test_req11_hybrid_recall_falls_back_to_text_through_the_service(
        make_holder: Callable[[str], ConfigHolder], bag_of_words_api: FakeModelApi) -> None:
    holder = make_holder(f'[model_api]\nbase_url = "{bag_of_words_api.base_url}"\nembedding_model = "fake-embed"\n')
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        result = await memory.ingest_run(run_record())
        assert result["outcome"] == "recorded"
        assert await memory.builtin.wait_embedded() == 0  # embedded in the background
        assert len(bag_of_words_api.requests_to("/v1/embeddings")) == 1
        ok = await memory.recall(query="ledger rounding", repo="forge.example/acme/api")
        assert ok["degraded"] is None
        assert [e["episode_id"] for e in ok["episodes"]] == [result["episode_id"]]
        bag_of_words_api.behaviour.embed_status = 503
        # A query not asked before (a repeated one has its vector cached and needs no model).
        fallback = await memory.recall(query="rounding ledger", repo="forge.example/acme/api")
        assert fallback["degraded"] == "embeddings_unavailable"
        assert [e["episode_id"] for e in fallback["episodes"]] == [result["episode_id"]]


async def test_the_builtin_provider_serves_stdio_as_an_upstream(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    """`memactors provider serve-builtin --stdio --db PATH`, configured as [mcp.bi] and checked."""
    db = tmp_path / "upstream.db"
    holder = make_holder(
        f'[mcp.bi]\ncommand = "{sys.executable}"\n'
        f'args = ["-m", "memactors.cli", "provider", "serve-builtin", "--stdio", "--db", "{db}"]\n'
        # the connection budget (5 × provider_timeout) must cover the subprocess's start on a loaded machine
        '[memory.episodes]\nprovider_timeout = "10s"\n')
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        report = await memory.check_provider("bi")
    assert [c["status"] for c in report["checks"]] == ["pass"] * 7, report
    assert report["provider_name"] == "builtin"
    upstream = await open_store(db)
    try:
        assert await upstream.read(lambda d: d.execute("SELECT count(*) FROM builtin_docs").fetchone()[0]) == 0
    finally:
        upstream.close()


# -- scope inside the index, the AND-then-OR plan, compact item text ---------------

def _episode_text(*, outcome: str = "failed", branch: str = "main", files: str = "src/ledger.py",
                  failures: str = "test_failure: 2", excerpt: str = "") -> str:
    """A REQ-5 style rendering: one `name: value` line per field."""
    return "".join(f"{k}: {v}\n" for k, v in (
        ("episode_id", "ep_1"), ("harness", "api-fixer"), ("run_id", "42"), ("repo", "forge.example/acme/api"),
        ("branch", branch), ("outcome", outcome), ("files_touched", files), ("verify_failures", failures),
        ("result_excerpt", excerpt), ("summary", ""), ("scope", A)))


async def test_the_match_is_restricted_to_the_callers_scope_inside_fts5(store: Store) -> None:
    """The FTS5 query itself is bounded to the scope's doc-id range: a match in another scope is never even
    a candidate, however much better it ranks."""
    from memactors.builtin import bm25_candidates

    p = BuiltinProvider(store)
    for n in range(30):
        await p.record(_args(f"ep_b{n:02d}", "ledger rounding ledger", scope=B))
    await p.record(_args("ep_a", "ledger rounding", scope=A))
    hits = await store.read(lambda db: bm25_candidates(db, ["ledger"], [A], 8))
    assert [h.episode_id for h in hits] == ["ep_a"]
    # The index itself holds scope tokens: matching on the token alone finds only that scope's docs.
    from memactors.store import scope_key
    n_in_b = await store.read(lambda db: db.execute(
        "SELECT count(*) FROM builtin_fts WHERE builtin_fts MATCH ?", [f'scope_key : "{scope_key(B)}"']).fetchone()[0])
    assert n_in_b == 30


@pytest.mark.both_engines
async def test_the_and_of_the_words_is_tried_first_and_or_only_when_it_finds_fewer_than_limit(store: Store) -> None:
    p = BuiltinProvider(store, relevance_floor=0.0)  # the candidates' plan, not the floor (which drops ep_one)
    await p.record(_args("ep_both1", "ledger rounding fixed"))
    await p.record(_args("ep_both2", "rounding in the ledger"))
    await p.record(_args("ep_one", "ledger ledger ledger ledger only"))
    # limit 2: the AND finds two, so the OR-only episode is not a candidate (even with more "ledger").
    out = await p.recall({"query": "ledger rounding", "scope": [A], "limit": 2})
    assert sorted(i["id"] for i in out["items"]) == ["ep_both1", "ep_both2"]
    # limit 3: the AND finds fewer than 3, so every word is OR-ed and the third comes back too.
    out = await p.recall({"query": "ledger rounding", "scope": [A], "limit": 3})
    assert {i["id"] for i in out["items"]} == {"ep_both1", "ep_both2", "ep_one"}


@pytest.mark.both_engines
async def test_item_text_is_the_runs_own_words_then_the_words_around_the_match(store: Store) -> None:
    """The gist leads with the start of the excerpt, then a snippet around the query's words
    when they come later, then the files and failures once; no field names, nothing the provenance
    line says, only the episode's own words."""
    from memactors.actors.index import text_belongs

    p = BuiltinProvider(store)
    filler = " ".join(f"word{n}" for n in range(300))
    text = _episode_text(excerpt=f"Pinned the clock in reconcile. {filler} the flaky ledger rounding was fixed {filler}")
    await p.record(_args("ep_1", text))
    out = await p.recall({"query": "ledger rounding", "scope": [A], "limit": 5})
    item = out["items"][0]["text"]
    assert item.startswith("Pinned the clock in reconcile. word0")
    assert "… …word298 word299 the flaky ledger rounding was fixed" in item
    assert item.endswith("touched src/ledger.py · verify failures: test_failure ×2")
    for label in ("summary:", "result_excerpt", "outcome", "api-fixer", "branch", "\\n", "\n"):
        assert label not in item
    assert text_belongs(item, text) and len(item) <= 320
    # A path-only hit (no word matched) leads with the start of its excerpt too.
    await p.record(_args("ep_2", _episode_text(excerpt="renamed the module"), files=("src/x.py",)))
    out = await p.recall({"query": "zzz", "scope": [A], "limit": 5, "paths": ["src/x.py"]})
    assert out["items"][0]["text"].startswith("renamed the module · touched")


@pytest.mark.both_engines
async def test_item_text_of_a_long_episode_stays_bounded(store: Store) -> None:
    p = BuiltinProvider(store)
    files = ", ".join(f"src/pkg{n}/module_{n}.py" for n in range(50))
    await p.record(_args("ep_1", _episode_text(files=files, excerpt="ledger " * 500)))
    await p.record(_args("ep_2", "x", summary="s" * 280 + " ledger"))
    out = await p.recall({"query": "ledger", "scope": [A], "limit": 5})
    assert len(out["items"]) == 2
    for item in out["items"]:
        assert len(item["text"]) <= 320
    assert any("touched src/pkg0/module_0.py" in i["text"] and ", …" in i["text"] for i in out["items"])


async def test_the_text_is_stored_once_and_the_index_follows_updates_and_deletes(store: Store) -> None:
    """External-content FTS5: no second copy of the body; triggers keep the index in step."""
    p = BuiltinProvider(store)
    await p.record(_args("ep_1", "ledger rounding"))
    sql = await store.read(lambda db: db.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'builtin_fts'").fetchone()[0])
    assert "content = 'builtin_docs'" in sql or "content='builtin_docs'" in sql
    assert await store.read(lambda db: db.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'builtin_fts_content'").fetchone()[0]) == 0
    await p.record(_args("ep_1", "billing refactor"))  # new content for the same episode
    assert await _ids(p, "ledger") == []
    assert await _ids(p, "billing") == ["ep_1"]
    await p.forget({"id": "ep_1"})
    assert await _ids(p, "billing") == []
    check = await store.read(lambda db: db.execute(
        "INSERT INTO builtin_fts (builtin_fts, rank) VALUES ('integrity-check', 1)").fetchall())
    assert check == []


#: The built-in provider's tables as migration 0001 made them (before 0006 and 0009 ran).
_PRE_0006 = """
    DROP TRIGGER builtin_docs_fts_insert; DROP TRIGGER builtin_docs_fts_delete;
    DROP TRIGGER builtin_docs_fts_update; DROP TABLE builtin_fts; DROP TABLE builtin_docs; DROP TABLE builtin_scopes;
    CREATE TABLE builtin_docs (doc_id INTEGER PRIMARY KEY, episode_id TEXT NOT NULL UNIQUE, scope TEXT NOT NULL,
        text TEXT NOT NULL, summary TEXT NOT NULL DEFAULT '', files TEXT NOT NULL DEFAULT '[]',
        started_at TEXT NOT NULL, content_hash TEXT NOT NULL);
    CREATE INDEX builtin_docs_by_scope ON builtin_docs (scope);
    CREATE VIRTUAL TABLE builtin_fts USING fts5 (text, summary, tokenize = 'porter unicode61');
    DELETE FROM _sqlite_migrations WHERE name IN ('0006_builtin_scope_in_fts', '0009_flat_text_and_builtin_fields');
"""


async def test_an_existing_database_is_upgraded_to_scope_in_fts(tmp_path: Path) -> None:
    """Migration 0006 on a store written by the previous schema: the index is rebuilt with scope tokens."""
    import sqlean

    path = tmp_path / "old.db"
    s = await open_store(path)
    s.close()
    db = sqlean.connect(str(path), isolation_level=None)
    db.executescript(_PRE_0006)
    for n, (eid, scope) in enumerate((("ep_a", A), ("ep_b", B)), start=1):
        db.execute("INSERT INTO builtin_docs (doc_id, episode_id, scope, text, summary, files, started_at,"
                   " content_hash) VALUES (?, ?, ?, 'ledger rounding', '', '[]', '2026-11-28', 'h')", [n, eid, scope])
        db.execute("INSERT INTO builtin_fts (rowid, text, summary) VALUES (?, 'ledger rounding', '')", [n])
    db.close()
    s = await open_store(path)
    try:
        p = BuiltinProvider(s)
        assert await _ids(p, "ledger") == ["ep_a"]
        assert await _ids(p, "ledger", [B]) == ["ep_b"]
        await p.record(_args("ep_c", "ledger"))
        assert sorted(await _ids(p, "ledger")) == ["ep_a", "ep_c"]
        # Renumbered into per-scope doc-id ranges: A's documents share one range, B's another.
        ids = dict(await s.read(lambda db: db.execute("SELECT episode_id, doc_id >> 32 FROM builtin_docs").fetchall()))
        assert ids["ep_a"] == ids["ep_c"] != ids["ep_b"]
    finally:
        s.close()


@pytest.mark.slow
async def test_serve_builtin_stdio_refuses_requests_outside_its_shipped_schema(tmp_path: Path) -> None:
    """Over stdio any MCP client may call it, so it checks its advertised input schema."""
    import mcp

    params = mcp.StdioServerParameters(command=sys.executable, args=[
        "-m", "memactors.cli", "provider", "serve-builtin", "--stdio", "--db", str(tmp_path / "up.db")])
    async with mcp.Client(params) as client:
        bad = (({"query": "q", "scope": [A], "limit": 50}, "limit"),
               ({"query": "q" * 600, "scope": [A], "limit": 5}, "query"),
               ({"query": "q", "scope": [A, B, "project:c"], "limit": 5}, "scope"),
               ({"query": "q", "scope": [A], "limit": 5, "extra": 1}, "extra"))
        for arguments, field in bad:
            result = await client.call_tool("memory_recall", arguments)
            assert result.is_error, arguments
            text = result.content[0].text  # type: ignore[union-attr]
            assert "INVALID_ARGUMENT" in text and field in text, text
        ok = await client.call_tool("memory_recall", {"query": "q", "scope": [A], "limit": 5})
        assert not ok.is_error and ok.structured_content == {"items": []}


@pytest.mark.both_engines
async def test_the_embedding_text_is_the_runs_words_without_field_names_ids_or_timestamps(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    """What is sent to the embedding model is what the run said and did — its result words
    (its summary when it has one), its failure classes — and none of the REQ-5 rendering's field
    names, ids or timestamps, which filled 74 % of the model's window. Nor its paths (text version 2:
    they made cosine worse on real history; BM25 and the path ranking match them exactly)."""
    from memactors.episode import FIELD_ORDER

    values = {name: "" for name in FIELD_ORDER}
    values.update(episode_id="ep_4f2a9c", harness="api-fixer", adapter="claude-code", run_id="run-77",
                  repo="forge.example/acme/api", branch="main", outcome="success",
                  started_at="2026-11-28T09:00:00Z", ended_at="2026-11-28T09:05:00Z",
                  result_excerpt="Retry the upload when the storage bucket answers a throttling error",
                  files_touched="src/upload.py, tests/test_upload.py", verify_failures="TimeoutError: 2")
    rendering = "".join(f"{name}: {values[name]}\n" for name in FIELD_ORDER)
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed")
    await p.record({"episode_id": "ep_4f2a9c", "scope": A, "trust_class": "standard", "text": rendering,
                    "episode": {"started_at": "2026-11-28T09:00:00Z"}})
    await p.record(_args("ep_sum", "the excerpt words", summary="Summarised: uploads retried on throttling"))
    assert await p.embed_pending() == 2
    (request,) = bag_of_words_api.requests_to("/v1/embeddings")
    (from_rendering,) = [x for x in request.body["input"] if "upload" in x and "Summarised" not in x]
    (with_summary,) = [x for x in request.body["input"] if "Summarised" in x]
    assert from_rendering.startswith("Retry the upload when the storage bucket answers a throttling error")
    assert "TimeoutError" in from_rendering and "src/upload.py" not in from_rendering
    for name in FIELD_ORDER:
        assert f"{name}:" not in from_rendering and name not in from_rendering.split(), name
    for value in ("ep_4f2a9c", "run-77", "2026-11-28", "api-fixer", "claude-code", "forge.example"):
        assert value not in from_rendering
    assert with_summary == "Summarised: uploads retried on throttling"  # the summary, not the excerpt


def test_a_confident_text_match_stays_first_and_a_match_of_both_rankings_beats_either_alone() -> None:
    """The fusion (`ranking.fuse_hybrid`): plain RRF put an item that both rankings hold in the
    middle above BM25's clear first hit (own-words MRR 1.000 → 0.938 on real history). BM25's first
    hit stays first when it scores CONFIDENT times its second; when it does not, an item good in both
    rankings comes first, and the best item of either ranking alone still scores."""
    from memactors.builtin.ranking import CONFIDENT, Hit, fuse_hybrid

    def hits(*scored: tuple[str, float]) -> list[Hit]:
        return [Hit(eid, n, "2026-11-28T09:00:00Z", score) for n, (eid, score) in enumerate(scored)]

    cosine = hits(("both", 0.9), ("cos_only", 0.85), ("clear", 0.2))
    confident = hits(("clear", 10.0), ("both", 10.0 / CONFIDENT - 0.5), ("weak", 1.0))
    fused = fuse_hybrid(confident, cosine)
    assert max(fused, key=fused.__getitem__) == "clear"
    assert fused["clear"] > 1.0 >= max(v for k, v in fused.items() if k != "clear")
    unsure = hits(("close", 10.0), ("both", 9.0), ("weak", 1.0))
    fused = fuse_hybrid(unsure, cosine)
    assert sorted(fused, key=fused.__getitem__, reverse=True)[:3] == ["both", "cos_only", "close"]
    assert all(0.0 <= v <= 1.0 for v in fused.values())
    # One ranking alone (the query could not be embedded, or BM25 matched nothing): its order.
    assert sorted(fuse_hybrid([], cosine), key=lambda k: -fuse_hybrid([], cosine)[k]) == ["both", "cos_only", "clear"]
    assert fuse_hybrid(hits(("only", 3.0)), [])["only"] == pytest.approx(1.4)


async def test_sqlite_scores_its_hits_for_the_fusion(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    """SQLite: BM25 (negated FTS5 rank) and sqlite-vec's cosine similarity (1 − distance). PostgreSQL
    with pgvector: `test_store_pg.py::test_postgresql_scores_its_hits_for_the_fusion`."""
    await check_scored_hits(store, embed_client)


async def test_a_repeated_gateway_recall_does_not_run_the_embedding_model_again(
        make_holder: Callable[[str], ConfigHolder], bag_of_words_api: FakeModelApi) -> None:
    """The query's vector is cached by model and text: the same question through the gateway a second
    time (another run's agent, even) is answered alike with no embedding request; a new one makes one."""
    holder = make_holder(RESIDENT + f'[model_api]\nbase_url = "{bag_of_words_api.base_url}"\nembedding_model = "fake-embed"\n')
    async with serving(holder) as (memory, url):
        for i, text in enumerate(("ledger rounding fixed", "invoice totals rounded in the ledger")):
            await memory.ingest_run(run_record(run_id=str(i + 1), trace_id=f"t-{i}", result_text=text))
        assert await memory.builtin.wait_embedded() == 0
        documents = []
        for run in ("100", "101"):
            token, _ = await as_run(memory, "api-fixer", run, "forge.example/acme/api")
            before = len(bag_of_words_api.requests_to("/v1/embeddings"))
            async with gateway_client(url, token) as client:
                result = await client.call_tool("recall", {"query": "ledger rounding", "limit": 5})
            assert not result.is_error
            text = "".join(c.text for c in result.content if isinstance(c, t.TextContent))
            documents.append(re.findall(r"^- episode · .*?· run (\w+)", text, re.M))
            model_runs = len(bag_of_words_api.requests_to("/v1/embeddings")) - before
            assert model_runs == (1 if run == "100" else 0)
        assert documents[0] == documents[1] and documents[0]
        async with gateway_client(url, token) as client:
            assert not (await client.call_tool("recall", {"query": "invoice totals", "limit": 5})).is_error
        assert len(bag_of_words_api.requests_to("/v1/embeddings")) - before == 1  # a new question is embedded


def _old_vec_table(path: Path) -> int:
    """Make a store's vectors as stores made before int8 vectors hold them: `builtin_vec` of float32 in
    vec0's default chunks (1024 vectors per scope), and every vector also copied in its embedding-cache
    row; the bytes its vectors then take."""
    db = _connect(path)
    try:
        dim = int(db.execute("SELECT value FROM builtin_meta WHERE key = 'vec_dim'").fetchone()[0])
        db.execute("BEGIN")
        rows = [(d, s, serialize_float32(as_floats(bytes(e), dim)))
                for d, s, e in db.execute("SELECT doc_id, scope, embedding FROM builtin_vec").fetchall()]
        copies = dict((d, e) for d, _s, e in rows)
        db.execute("DROP TABLE builtin_vec")
        db.execute(f"CREATE VIRTUAL TABLE builtin_vec USING vec0(doc_id INTEGER PRIMARY KEY,"
                   f" scope TEXT PARTITION KEY, embedding float[{dim}] distance_metric=cosine)")
        db.execute("DELETE FROM builtin_meta WHERE key IN ('vec_chunk', 'vec_form', 'cache_form')")
        for row in rows:
            db.execute("INSERT INTO builtin_vec (doc_id, scope, embedding) VALUES (?, ?, ?)", list(row))
        for doc_id, blob in copies.items():
            db.execute("UPDATE builtin_embed_cache SET vector = ?, doc_id = NULL WHERE doc_id = ?", [blob, doc_id])
        db.execute("COMMIT")
        return _vector_bytes(db)
    finally:
        db.conn.close()


def _vector_bytes(db: Any) -> int:
    """The bytes the vectors take: the vec0 table's pages and the embedding cache's."""
    return int(db.execute("SELECT sum(pgsize) FROM dbstat WHERE name LIKE 'builtin_vec%'"
                          " OR name LIKE 'builtin_embed_cache%'").fetchone()[0])


def _cache_copies(db: Any) -> int:
    return int(db.execute("SELECT count(*) FROM builtin_embed_cache WHERE length(vector) > 0").fetchone()[0])


async def test_a_store_made_before_compact_vectors_is_upgraded_at_start_with_its_vectors_kept(
        make_holder: Callable[[str], ConfigHolder], bag_of_words_api: FakeModelApi) -> None:
    """float32 vectors in vec0's default chunks, each also copied in the embedding cache: at start they
    become int8 in small chunks, stored once (the cache points at them), and recall answers alike
    without the model embedding an episode again."""
    holder = make_holder(f'[model_api]\nbase_url = "{bag_of_words_api.base_url}"\nembedding_model = "fake-embed"\n')
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        for i, text in enumerate(("ledger rounding fixed", "invoice page rounding")):
            await memory.ingest_run(run_record(run_id=str(i + 1), trace_id=f"t-{i}", result_text=text))
        assert await memory.builtin.wait_embedded() == 0
        before = await memory.recall(query="rounding", repo="forge.example/acme/api")
        path = memory.store.path
    old_bytes = _old_vec_table(path)
    check = _connect(path)
    assert _cache_copies(check) == 2
    check.conn.close()
    requests = len(bag_of_words_api.requests_to("/v1/embeddings"))
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        status = await memory.builtin.vector_status()
        assert status["with_vector"] == 2 and status["pending"] == 0  # kept, not back-filled again
        after = await memory.recall(query="rounding", repo="forge.example/acme/api")
        assert after["episodes"] == before["episodes"] and after["episodes"]
        new_bytes = await memory.store.read(_vector_bytes)
        assert await memory.store.read(_cache_copies) == 0  # each vector once, in builtin_vec
        form = await memory.store.read(lambda db: db.execute(
            "SELECT value FROM builtin_meta WHERE key = 'vec_form'").fetchone()[0])
        assert form == "int8"
    assert len(bag_of_words_api.requests_to("/v1/embeddings")) == requests + 1  # the recall's query only
    assert new_bytes < old_bytes / 4, (old_bytes, new_bytes)


async def test_a_forgotten_episodes_vector_stays_cached_for_its_text(
        store: Store, bag_of_words_api: FakeModelApi, embed_client: ModelApiClient) -> None:
    """The vector is stored once (the cache points at the document's), yet REQ-11's cache by content
    and model outlives the document: the same text recorded again after a forget, or after every
    vector is retired, gets its vector back with no model request."""
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed", relevance_floor=0.0)
    await p.record(_args("ep_1", "rounding error in invoices"))
    assert await p.embed_pending() == 1
    assert await store.read(_cache_copies) == 0
    assert await p.forget({"id": "ep_1"}) == {"forgotten": True}
    assert await store.read(_cache_copies) == 1  # the vector left builtin_vec for the cache
    await p.record(_args("ep_2", "rounding error in invoices", started="2026-11-29T09:00:00Z"))
    assert await p.embed_pending() == 1
    assert len(bag_of_words_api.requests_to("/v1/embeddings")) == 1  # from the cache
    assert await store.read(_cache_copies) == 0  # and pointed at ep_2's again
    assert await store.write(lambda db: retire_vectors(db, "fake-embed", everything=True))
    assert await store.read(_cache_copies) == 1
    assert await p.embed_pending() == 1
    assert len(bag_of_words_api.requests_to("/v1/embeddings")) == 1
    assert [i["id"] for i in (await p.recall({"query": "invoices", "scope": [A], "limit": 5}))["items"]] == ["ep_2"]
