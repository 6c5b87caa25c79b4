"""`DocIndex`: what the built-in provider asks of each store engine's index (``index_sqlite``,
``index_pg``). The provider's flow (``memactors.builtin``) is written once against it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, Protocol

from ..store.builtin_docs import DocFields
from .ranking import Evidence, Hit
from .vector_cells import CellIndex

#: The embedding cache's key of a document's text: (summary, excerpt, failures JSON) -> digest, the
#: provider's (`builtin.embedding_text` then `builtin.text_digest`).
DocDigest = Callable[[str, str, str], str]


def quantize(vector: Sequence[float]) -> bytes:
    """A vector as `builtin_vec` holds it (VEC_FORM): int8, scaled so its largest component is ±127."""
    peak = max((abs(float(x)) for x in vector), default=0.0) or 1.0
    return array("b", (round(float(x) * 127.0 / peak) for x in vector)).tobytes()


def stored_form(blob: bytes, dim: int) -> bytes:
    """A vector's bytes in VEC_FORM, from either form a store has held: int8 (`dim` bytes) or an older
    store's float32 (sqlite-vec's serialisation, 4 × `dim` bytes)."""
    if len(blob) == 4 * dim:
        return quantize(memoryview(blob).cast("f").tolist())
    if len(blob) != dim:
        raise ValueError(f"a stored vector of {len(blob)} bytes is neither int8 nor float32 of dimension {dim}")
    return blob


def as_floats(blob: bytes, dim: int) -> list[float]:
    """A stored vector (either form) as a unit float vector, for an engine that stores floats (pgvector)."""
    if len(blob) == 4 * dim:
        return [float(x) for x in memoryview(blob).cast("f")]
    values = array("b", stored_form(blob, dim)).tolist()
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]


class DocIndex(CellIndex, Protocol):
    """What the built-in provider's flow asks of a store engine: where the documents, ranking inputs and
    vectors are, and the queries over them. Everything else — the contract, the fields and item text of
    an episode, the embedding calls and their deadlines, and REQ-11's ranking (which rankings, RRF with
    k = 60, the path boost, the tie-breaks, the metadata-only query) — is `BuiltinProvider`'s, written
    once for both engines. SQLite's (FTS5 with BM25, sqlite-vec) is `builtin.index_sqlite.SqliteIndex`, with
    `builtin/ranking.py`'s FTS5 statements; PostgreSQL's (tsvector with `ts_rank_cd`, pgvector) is
    `builtin.index_pg.PgIndex`.

    A large scope's vectors are divided into cells (`CellIndex`, `builtin.vector_cells`) by the
    back-fill; `knn` reads the nearest cells of such a scope.

    Every method takes the `Db` of a `Store.write` (the writes) or `Store.read` (the queries) call. Hits
    come best first; a ranking's tie-breaks are recency, then episode id, on both engines.
    """

    def write_doc(self, db: Any, *, episode_id: str, scope: str, fields: DocFields, started_at: str,
                  digest: str) -> tuple[int, bool]:
        """Insert or replace one episode's document: (doc_id, changed). The same content again changes
        nothing (a retried record, two daemons recording one episode)."""
        ...

    def forget(self, db: Any, episode_id: str) -> bool:
        """Delete the episode's document and its vector; whether there was one."""
        ...

    def text_candidates(self, db: Any, words: Sequence[str], scopes: Sequence[str], limit: int,
                        candidates: int) -> list[Hit]:
        """The best text matches in `scopes` by the engine's ranking (AND of the words first, every
        word OR-ed when that finds fewer than `limit`), at most `candidates`."""
        ...

    def metadata_only(self, db: Any, words: Sequence[str], scopes: Sequence[str],
                      absent: MutableMapping[tuple[str, int, str], int] | None = None) -> bool:
        """Whether the words only select the scope's episodes (REQ-14's briefing query):
        `ranking.metadata_only` (`absent`: what the caller's earlier probes proved, where kept)."""
        ...

    def briefing_order(self, db: Any, words: Sequence[str], scopes: Sequence[str]) -> list[Hit]:
        """A metadata-only query's answer: `ranking.briefing_rank` over the scope's newest episodes."""
        ...

    def path_candidates(self, db: Any, paths: Sequence[str], scopes: Sequence[str], among: Sequence[int]) -> list[Hit]:
        """The episodes of `scopes` that touched one of `paths`: `ranking.path_candidates`."""
        ...

    def knn(self, db: Any, vector: Sequence[float], scopes: Sequence[str]) -> list[Hit]:
        """The best CANDIDATES episodes of `scopes` by cosine distance to `vector`; none without vectors."""
        ...

    def evidence(self, db: Any, words: Sequence[str], scopes: Sequence[str], doc_ids: Sequence[int],
                 vectors: bool = False) -> Evidence:
        """What the relevance score is made of (`ranking.Evidence`): the scopes' documents, each word's
        documents, the words each of `doc_ids` holds and, with `vectors`, which of them have a vector."""
        ...

    def vector_from_cache(self, db: Any, *, doc_id: int, scope: str, model: str, digest: str) -> bool:
        """Give the document its vector from the embedding cache; False when the cache has none."""
        ...

    def write_vector(self, db: Any, *, doc_id: int, scope: str, model: str, digest: str,
                     vector: Sequence[float]) -> None:
        """Store one episode's embedding (and cache it by content)."""
        ...

    def check_vectors(self, db: Any, model: str, doc_digest: DocDigest) -> bool:
        """At start, with an embedding model: whether vectors can be stored (saying once when not); a
        store made before brings its vectors to this version's form (stored once, the cache's rows
        found by `doc_digest`)."""
        ...

    def missing_vectors(self, db: Any) -> int:
        """Episodes without an embedding."""
        ...

    def pending_docs(self, db: Any, limit: int, before: int | None = None,
                     among: Sequence[int] | None = None) -> list[tuple[int, str, str, str, str, str]]:
        """Up to `limit` documents without a vector, newest first (doc ids below `before` when given: a
        pass's next page; only those of `among` when given: a recall's candidates): (doc_id, scope,
        summary, excerpt, files JSON, failures JSON)."""
        ...

    def doc_exists(self, db: Any, doc_id: int) -> bool:
        """Whether the document is still there (it may be forgotten while its text is embedded)."""
        ...

    def retire_vectors(self, db: Any, model: str, *, everything: bool = False) -> bool:
        """Drop the vectors when they are of another model or embedding-text version (or all of them)."""
        ...

    def vector_count(self, db: Any) -> tuple[int, int]:
        """(documents, documents with a vector)."""
        ...
