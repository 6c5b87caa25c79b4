"""The built-in provider's relevance, through the service an operator's `Recall` and an agent's
gateway call reach: an episode still without a vector is ranked on its text (never below BM25 alone while
the back-fill runs), one 0–1 score scale on every install, and a floor below which nothing is served.

On SQLite and on PostgreSQL with pgvector (the engines whose stores hold vectors)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from memactors.builtin import ranking
from memactors.builtin.ranking import RELEVANCE_FLOOR
from memactors.config import ConfigHolder, load_config
from memactors.service import MemoryService, open_memory_service
from memactors.testing.fake_model_api import FakeModelApi
from support import example, run_record, wait_ready, write_config

API = "forge.example/acme/api"


@pytest.fixture
async def hybrid(tmp_path: Path, vector_store_url: str | None, bag_of_words_api: FakeModelApi) -> AsyncIterator[MemoryService]:
    """The service with hybrid ranking (an embedding model behind the fake model API) on the engine."""
    path = write_config(tmp_path, f'[model_api]\nbase_url = "{bag_of_words_api.base_url}"\nembedding_model = "fake-embed"\n',
                        store_url=vector_store_url)
    async with open_memory_service(ConfigHolder(lambda: load_config(path, env={"HOME": str(tmp_path)}))) as memory:
        await wait_ready(memory)
        yield memory


async def _ingest(memory: MemoryService, run_id: str, text: str, started: str) -> str:
    result = await memory.ingest_run(run_record(run_id=run_id, trace_id=f"t-{run_id}", result_text=text,
                                                started_at=started, ended_at=started))
    assert result["outcome"] == "recorded"
    return str(result["episode_id"])


def _ids(answer: dict[str, Any]) -> list[str]:
    return [e["episode_id"] for e in answer["episodes"]]


async def _drop_vectors(memory: MemoryService, episode_ids: list[str]) -> None:
    """Make those episodes what a fresh import's are before the back-fill reaches them: no vector."""
    def drop(db: Any) -> None:
        for eid in episode_ids:
            (doc_id,) = db.execute("SELECT doc_id FROM builtin_docs WHERE episode_id = ?", [eid]).fetchone()
            db.execute("DELETE FROM builtin_vec WHERE doc_id = ?", [doc_id])

    await memory.store.write(drop)


async def test_an_episode_without_its_vector_yet_ranks_where_bm25_alone_ranks_it(hybrid: MemoryService) -> None:
    memory = hybrid
    # Episodes sharing a word or two of the question, embedded; then the one that answers it, whose
    # vector is not there yet (recorded, the back-fill not reached).
    for n, text in enumerate(("ledger export job renamed", "ledger totals page", "refunds in ledger",
                              "ledger rounding reconcile and notes on invoices from the last week")):
        await _ingest(memory, f"{n + 1}", text, f"2026-11-2{n}T09:00:00Z")
    answer_id = await _ingest(memory, "9", "ledger rounding reconcile invoices fixed", "2026-11-10T09:00:00Z")
    assert await memory.builtin.wait_embedded() == 0
    await _drop_vectors(memory, [answer_id])
    status = await memory.builtin.vector_status()
    assert status["pending"] == 1

    query = "ledger rounding reconcile invoices"
    half = await memory.recall(query=query, repo=API)
    assert half["degraded"] is None  # the cosine ranking took part
    # The same store ranked by text alone (the query not embedded, as with `embeddings = false`).
    memory.builtin.query_embedder = _failing_embedder
    memory.builtin._query_vectors.clear()  # the query's vector is cached: asked afresh, it fails
    text_only = await memory.recall(query=query, repo=API)
    assert text_only["degraded"] == "embeddings_unavailable"
    assert _ids(text_only)[0] == answer_id
    assert _ids(half)[0] == answer_id  # not pushed below by the vector it does not have yet


async def test_while_most_episodes_wait_for_their_vector_the_few_embedded_do_not_jump_bm25s_order(
        hybrid: MemoryService) -> None:
    memory = hybrid
    # Episodes matching the question less and less by their words, and a dozen sharing only "ledger";
    # only the fourth has its vector (what the back-fill's first pages give it), so it is the cosine
    # ranking's one hit and best.
    texts = ("ledger rounding reconcile invoices fixed", "ledger rounding reconcile notes",
             "ledger rounding drift in a long export of the monthly totals page",
             "ledger invoices cleanup of the old monthly export code",
             "ledger notes for the monthly export")
    ids = [await _ingest(memory, f"{n + 1}", text, f"2026-11-{10 + n}T09:00:00Z") for n, text in enumerate(texts)]
    others = [await _ingest(memory, f"{n + 10}", f"ledger housekeeping {n}", f"2026-10-{10 + n}T09:00:00Z")
              for n in range(12)]
    assert await memory.builtin.wait_embedded() == 0
    await _drop_vectors(memory, [eid for n, eid in enumerate(ids) if n != 3] + others)
    memory.builtin.relevance_floor = 0.0  # the order, whatever each item's score
    query = "ledger rounding reconcile invoices"
    half = await memory.recall(query=query, repo=API)
    assert half["degraded"] is None
    memory.builtin.query_embedder = _failing_embedder
    memory.builtin._query_vectors.clear()
    text_only = await memory.recall(query=query, repo=API)
    assert text_only["degraded"] == "embeddings_unavailable"
    assert ids[3] in _ids(text_only)[1:]
    assert _ids(half) == _ids(text_only)


async def test_while_the_back_fill_runs_an_episode_holding_every_word_is_served_as_bm25_alone_serves_it(
        hybrid: MemoryService) -> None:
    memory = hybrid
    # The answer holds both words of the question in a long account of other work (a faint cosine);
    # the few episodes embedded so far are unrelated, and the others matching a word wait for their
    # vector. Judged by the cosine ranking of those few, the answer would fall under the floor.
    filler = " ".join(f"step{n}" for n in range(100))
    answer = await _ingest(memory, "1", f"ledger rounding and then {filler}", "2026-11-20T09:00:00Z")
    waiting = [await _ingest(memory, f"{n + 10}", f"ledger notes {n}", f"2026-11-1{n}T09:00:00Z") for n in range(4)]
    for n in range(6):
        await _ingest(memory, f"{n + 20}", f"dependency bump {n} for the docs build", f"2026-10-1{n}T09:00:00Z")
    assert await memory.builtin.wait_embedded() == 0
    await _drop_vectors(memory, waiting)
    query = "ledger rounding"
    half = await memory.recall(query=query, repo=API)
    assert half["degraded"] is None  # the cosine ranking took part
    memory.builtin.query_embedder = _failing_embedder
    memory.builtin._query_vectors.clear()
    text_only = await memory.recall(query=query, repo=API)
    assert text_only["degraded"] == "embeddings_unavailable"
    assert _ids(text_only)[0] == answer
    assert _ids(half)[0] == answer


async def test_right_after_ingest_a_question_nothing_answers_is_answered_with_nothing_and_the_answer_still_found(
        hybrid: MemoryService) -> None:
    memory = hybrid
    texts = ("ledger rounding fixed in the nightly export job", "invoice totals page layout tweaks",
             "retry the webhook delivery on timeout", "dependency bump for the docs build",
             "release notes for the spring version", "flaky login test marked as slow")
    ids = [await _ingest(memory, f"{n + 1}", text, f"2026-11-1{n}T09:00:00Z") for n, text in enumerate(texts)]
    assert await memory.builtin.wait_embedded() == 0
    # None has its vector yet: what an agent meets right after `runs ingest` or an import, before the
    # back-fill has reached them.
    await _drop_vectors(memory, ids)
    assert (await memory.builtin.vector_status())["pending"] == len(texts)
    # A question about something this repository never did, sharing one word with one of its episodes
    # (ranked on that word alone, it was served: a share of the question's words, no cosine against it).
    assert _ids(await memory.recall(query="helm chart for the ledger", repo=API)) == []
    # Its candidates got their vectors at the recall: the back-fill has them already.
    assert (await memory.builtin.vector_status())["pending"] == len(texts) - 1
    # A question the store answers is answered as before.
    assert _ids(await memory.recall(query="webhook delivery retry", repo=API))[:1] == [ids[2]]


async def _failing_embedder(texts: Any) -> list[list[float]]:
    from memactors.modelapi import ModelApiError

    raise ModelApiError("the embedding model is down (test)")


async def test_recall_answers_nothing_when_no_episode_is_relevant_and_scores_are_0_to_1(
        hybrid: MemoryService) -> None:
    memory = hybrid
    for name in ("run-42-api-fixer.json", "run-7-billing-bot.json", "run-9-pr-triage.json"):
        assert (await memory.ingest_run(example(name)))["outcome"] == "recorded"
    assert await memory.builtin.wait_embedded() == 0
    found = await memory.recall(query="flaky ledger", repo="forge.example/acme/api")
    assert [e["run_id"] for e in found["episodes"]] == ["42"]
    # The billing repository's only episode shares no word and no meaning with the question.
    assert (await memory.recall(query="flaky ledger", repo="forge.example/acme/billing"))["episodes"] == []
    scores = [float(item["provenance"]["score"]) for item in _items(found)]
    assert scores and all(RELEVANCE_FLOOR <= s <= 1.0 for s in scores)


async def test_a_question_whose_key_words_the_repository_never_holds_is_answered_with_nothing(
        hybrid: MemoryService, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = hybrid
    # A word none of a thousand episodes says counts whole (`ranking.UNKNOWN_DOCS`); these four stand
    # for such a repository here.
    monkeypatch.setattr(ranking, "UNKNOWN_DOCS", 4)
    for n, text in enumerate(("ledger rounding fixed in the nightly export", "ledger totals page layout",
                              "ledger export renamed", "ledger rounding notes for invoices")):
        await _ingest(memory, f"{n + 1}", text, f"2026-11-1{n}T09:00:00Z")
    assert await memory.builtin.wait_embedded() == 0
    # Every episode says "ledger", and the first shares "rounding" and "export" with the question too:
    # its words and its vector are close, but what the question is about (a GraphQL subscription
    # client) no episode of the repository ever mentions.
    assert (await memory.recall(query="ledger rounding export graphql subscription client",
                                repo=API))["episodes"] == []
    # The same words without the unknown ones find it.
    found = await memory.recall(query="ledger rounding export", repo=API)
    assert [e["run_id"] for e in found["episodes"]][:1] == ["1"]


def _items(answer: dict[str, Any]) -> list[dict[str, Any]]:
    structured = answer["structured"]
    return [i for s in structured["sections"] if s["name"] == "episodes" for i in s["items"]]



async def test_status_doctor_and_metrics_say_how_many_episodes_wait_for_a_vector_and_since_when(
        hybrid: MemoryService, bag_of_words_api: FakeModelApi) -> None:
    memory = hybrid
    bag_of_words_api.behaviour.embed_status = 503  # the model down: the back-fill cannot catch up
    await _ingest(memory, "1", "ledger rounding fixed", "2026-11-20T09:00:00Z")
    await _ingest(memory, "2", "invoice totals page", "2026-11-21T09:00:00Z")
    status = (await memory.status())["embeddings"]
    assert status["pending"] == 2 and status["pending_since"]
    row = next(r for r in (await memory.doctor())["rows"] if r["name"] == "memory embeddings")
    assert row["status"] == "warn" and f"2 built-in episodes have no vector for fake-embed since {status['pending_since']}" in row["message"]
    exposition = memory.metrics.exposition().decode()
    assert "memactors_embeddings_pending 2.0" in exposition
    assert "memactors_embeddings_pending_seconds" in exposition
    bag_of_words_api.behaviour.embed_status = 200
    await memory.builtin.embed_pending()  # (the worker's own retry, 30 s on, may have begun on a loaded machine)
    status = (await memory.status())["embeddings"]
    assert status["pending"] == 0 and status["pending_since"] is None
    assert "memactors_embeddings_pending 0.0" in memory.metrics.exposition().decode()
