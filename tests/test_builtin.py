"""SPEC-0030 REQ-11: the built-in provider — BM25, hybrid RRF with sqlite-vec, path boost, scope, forget."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from memactors.builtin import RRF_K, BuiltinProvider, missing_vectors, rrf
from memactors.config import ConfigHolder
from memactors.modelapi import ModelApiClient, ModelApiSettings
from memactors.service import open_memory_service
from memactors.store import Store
from memactors.testing.fake_model_api import FakeBehaviour, FakeModelApi, run_fake_model_api
from support import run_record, wait_ready

pytestmark = pytest.mark.req11

A = "project:forge.example/acme/api"
B = "project:forge.example/acme/web"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "m.db")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelApi]:
    async with run_fake_model_api(behaviour=FakeBehaviour(embed_mode="bag_of_words", embed_dim=64)) as api:
        yield api


@pytest.fixture
async def embed_client(fake: FakeModelApi) -> AsyncIterator[ModelApiClient]:
    settings = ModelApiSettings(base_url=fake.base_url, api_key=None, utility_model=None,
                                embedding_model="fake-embed", requests_per_minute=6000, daily_requests=100000)
    async with ModelApiClient(settings) as client:
        yield client


def _args(eid: str, text: str, *, scope: str = A, started: str = "2026-11-28T09:00:00Z",
          files: tuple[str, ...] = (), summary: str | None = None) -> dict[str, Any]:
    return {"episode_id": eid, "scope": scope, "trust_class": "standard", "text": text,
            "episode": {"started_at": started, "files_touched": list(files), "summary": summary}}


async def _ids(provider: BuiltinProvider, query: str, scopes: list[str] = [A], **extra: Any) -> list[str]:  # noqa: B006
    out = await provider.recall({"query": query, "scope": scopes, "limit": 20, **extra})
    return [item["id"] for item in out["items"]]


async def test_bm25_ranks_the_better_match_first(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_1", "refactored the billing module"))
    await p.record(_args("ep_2", "ledger test flaky; fixed the ledger rounding in the ledger"))
    await p.record(_args("ep_3", "ledger mentioned once"))
    assert await _ids(p, "ledger rounding") == ["ep_2", "ep_3"]


async def test_the_summary_is_indexed_and_served_with_the_text(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_1", "long body", summary="Fixed the flaky ledger test."))
    out = await p.recall({"query": "flaky", "scope": [A], "limit": 5})
    assert out["items"][0]["id"] == "ep_1"
    assert out["items"][0]["text"].startswith("summary: Fixed the flaky ledger test.")
    assert "degraded" not in out


async def test_recall_never_returns_another_scopes_episode(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_a", "ledger fix", scope=A, files=("src/ledger.py",)))
    await p.record(_args("ep_b", "ledger fix", scope=B, files=("src/ledger.py",)))
    assert await _ids(p, "ledger") == ["ep_a"]
    assert await _ids(p, "ledger", [B]) == ["ep_b"]
    assert await _ids(p, "nothing", [B], paths=["src/ledger.py"]) == ["ep_b"]
    assert sorted(await _ids(p, "ledger", [A, B])) == ["ep_a", "ep_b"]


async def test_ties_break_by_recency_then_id(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_c", "nothing", started="2026-11-01T00:00:00Z", files=("a.py",)))
    await p.record(_args("ep_b", "nothing", started="2026-11-02T00:00:00Z", files=("b.py",)))
    await p.record(_args("ep_a", "nothing", started="2026-11-01T00:00:00Z", files=("c.py",)))
    # One path ranking, newest first then id; equal fused scores keep that order.
    assert await _ids(p, "zzz", paths=["a.py", "b.py", "c.py"]) == ["ep_b", "ep_a", "ep_c"]
    fused = rrf([["x", "y"], ["y", "x"]])
    assert fused["x"] == fused["y"] == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + 2))


async def test_a_requested_path_boosts_the_episode_that_touched_it(store: Store) -> None:
    p = BuiltinProvider(store)
    await p.record(_args("ep_1", "ledger ledger ledger rounding", files=("src/other.py",)))
    await p.record(_args("ep_2", "ledger rounding", files=("src/ledger.py",)))
    await p.record(_args("ep_3", "unrelated", files=("src/ledger.py",)))
    assert await _ids(p, "ledger") == ["ep_1", "ep_2"]
    # With the path: ep_2 is in both rankings and wins; ep_3 comes back on the path alone.
    assert await _ids(p, "ledger", paths=["src/ledger.py"]) == ["ep_2", "ep_1", "ep_3"]


async def test_recording_twice_returns_the_same_ids_and_forget_of_unknown_is_false(store: Store) -> None:
    p = BuiltinProvider(store)
    assert (await p.record(_args("ep_1", "ledger")))["ids"] == ["ep_1"]
    assert (await p.record(_args("ep_1", "ledger")))["ids"] == ["ep_1"]
    assert await _ids(p, "ledger") == ["ep_1"]
    assert await p.forget({"id": "ep_unknown"}) == {"forgotten": False}
    assert await p.forget({"id": "ep_1"}) == {"forgotten": True}
    assert await p.forget({"id": "ep_1"}) == {"forgotten": False}
    assert await _ids(p, "ledger") == []


async def test_hybrid_embeds_at_record_time_once_per_content_and_fuses_cosine(
        store: Store, fake: FakeModelApi, embed_client: ModelApiClient) -> None:
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed")
    await p.record(_args("ep_1", "rounding error in invoices"))
    await p.record(_args("ep_2", "totally different words here"))
    assert len(fake.requests_to("/v1/embeddings")) == 2
    await p.record(_args("ep_1", "rounding error in invoices"))  # same content: cache, no request
    await p.record(_args("ep_9", "rounding error in invoices"))  # same content, other episode: cache too
    assert len(fake.requests_to("/v1/embeddings")) == 2
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


async def test_req11_hybrid_recall_falls_back_to_text(
        store: Store, fake: FakeModelApi, embed_client: ModelApiClient) -> None:
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed")
    await p.record(_args("ep_1", "ledger rounding fixed"))
    await p.record(_args("ep_2", "something else entirely"))
    fake.behaviour.embed_status = 503
    out = await p.recall({"query": "ledger", "scope": [A], "limit": 5})
    assert out["degraded"] == "embeddings_unavailable"
    assert [i["id"] for i in out["items"]] == ["ep_1"]  # FTS5 alone: no cosine-only hits


async def test_a_slow_embedding_model_does_not_hold_up_recall(
        store: Store, fake: FakeModelApi, embed_client: ModelApiClient) -> None:
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed", query_embed_deadline=0.2)
    await p.record(_args("ep_1", "ledger rounding fixed"))
    fake.behaviour.embed_delay = 30.0
    started = trio.current_time()
    out = await p.recall({"query": "ledger", "scope": [A], "limit": 5})
    assert trio.current_time() - started < 5
    assert out["degraded"] == "embeddings_unavailable"
    assert [i["id"] for i in out["items"]] == ["ep_1"]


async def test_an_episode_whose_embedding_fails_is_kept_without_a_vector(
        store: Store, fake: FakeModelApi, embed_client: ModelApiClient) -> None:
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed")
    fake.behaviour.embed_status = 503
    assert (await p.record(_args("ep_1", "ledger rounding fixed")))["ids"] == ["ep_1"]
    assert await store.read(missing_vectors) == 1
    fake.behaviour.embed_status = 200
    assert await _ids(p, "ledger") == ["ep_1"]


async def test_req11_hybrid_recall_falls_back_to_text_through_the_service(
        make_holder: Callable[[str], ConfigHolder], fake: FakeModelApi) -> None:
    holder = make_holder(f'[model_api]\nbase_url = "{fake.base_url}"\nembedding_model = "fake-embed"\n')
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        result = await memory.ingest_run(run_record())
        assert result["outcome"] == "recorded"
        assert len(fake.requests_to("/v1/embeddings")) == 1  # embedded at record time
        ok = await memory.recall(query="ledger rounding", repo="forge.example/acme/api")
        assert ok["degraded"] is None
        assert [e["episode_id"] for e in ok["episodes"]] == [result["episode_id"]]
        fake.behaviour.embed_status = 503
        fallback = await memory.recall(query="ledger rounding", repo="forge.example/acme/api")
        assert fallback["degraded"] == "embeddings_unavailable"
        assert [e["episode_id"] for e in fallback["episodes"]] == [result["episode_id"]]


async def test_the_builtin_provider_serves_stdio_as_an_upstream(
        make_holder: Callable[[str], ConfigHolder], tmp_path: Path) -> None:
    """`memactors provider serve-builtin --stdio --db PATH`, configured as [mcp.bi] and checked."""
    db = tmp_path / "upstream.db"
    holder = make_holder(
        f'[mcp.bi]\ncommand = "{sys.executable}"\n'
        f'args = ["-m", "memactors.cli", "provider", "serve-builtin", "--stdio", "--db", "{db}"]\n')
    async with open_memory_service(holder) as memory:
        await wait_ready(memory)
        report = await memory.check_provider("bi")
    assert [c["status"] for c in report["checks"]] == ["pass"] * 7, report
    assert report["provider_name"] == "builtin"
    upstream = await Store.open(db)
    try:
        assert await upstream.read(lambda d: d.execute("SELECT count(*) FROM builtin_docs").fetchone()[0]) == 0
    finally:
        upstream.close()
