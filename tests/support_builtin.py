"""Helpers for the built-in provider's tests on either store: an episode's record arguments, and the checks
of the scores each ranking gives the fusion (run on SQLite by tests/builtin/ and on PostgreSQL with pgvector
by tests/store/test_store_pg.py)."""

from __future__ import annotations

from typing import Any

from memactors.builtin import BuiltinProvider
from memactors.modelapi import ModelApiClient
from memactors.store import Store

#: The scope the built-in tests record into and recall from.
A = "project:forge.example/acme/api"


def episode_args(eid: str, text: str, *, scope: str = A, started: str = "2026-11-28T09:00:00Z",
                 files: tuple[str, ...] = (), summary: str | None = None) -> dict[str, Any]:
    """The built-in provider's `record` arguments for one episode in `scope`."""
    return {"episode_id": eid, "scope": scope, "trust_class": "standard", "text": text,
            "episode": {"started_at": started, "summary": summary, **({"files_touched": list(files)} if files else {})}}


async def check_scored_hits(store: Store, embed_client: ModelApiClient) -> None:
    """The fusion reads each ranking's own scores: the text hits are scored best first and above 0, the
    cosine hits carry their cosine similarity, best first, and a hybrid recall's scores say its order."""
    p = BuiltinProvider(store, embedder=embed_client.embed, embedding_model="fake-embed")
    await p.record(episode_args("ep_all", "rounding error in invoices fixed with decimal quantize"))
    await p.record(episode_args("ep_some", "rounding of totals in the ledger"))
    await p.record(episode_args("ep_none", "unrelated upload retry"))
    assert await p.embed_pending() == 3
    words = ["rounding", "invoices", "decimal"]
    text = await store.read(lambda db: p.index.text_candidates(db, words, [A], 3, 20))  # AND finds 1: OR
    assert [h.episode_id for h in text][:2] == ["ep_all", "ep_some"]
    assert text[0].score > text[1].score > 0
    (vector,) = await embed_client.embed(["rounding invoices decimal"])
    near = await store.read(lambda db: p.index.knn(db, vector, [A]))
    assert len(near) == 3 and near[0].episode_id == "ep_all"
    assert -1.0 <= near[-1].score <= near[1].score <= near[0].score <= 1.0
    out = await p.recall({"query": "rounding invoices decimal", "scope": [A], "limit": 5})
    scores = [item["score"] for item in out["items"]]
    assert out["items"][0]["id"] == "ep_all" and scores == sorted(scores, reverse=True)
