"""The built-in memory provider (SPEC-0030 REQ-11): the REQ-3 contract over the daemon's own store.

It is a real MCP server (the SDK's low-level `Server`), reached in-process through `mcp.Client(server)`
by the provider session, so conformance checks and scope enforcement exercise it exactly as they do an
upstream. `memactors provider serve-builtin --stdio [--db PATH]` serves the same server over stdio
(`builtin/stdio.py`) so it can be configured as an `[mcp.<name>]` upstream. Its ids are episode ids.

The package: this module is the provider's flow; ``index`` the `DocIndex` protocol, ``index_sqlite`` and
``index_pg`` its implementation on each store engine; ``ranking`` REQ-11's rankings (FTS5 statements,
RRF); ``stdio`` the stdio server. May import: the store interface (``memactors.store``, never an engine)
and the pure modules; the store never imports this package (the document columns both share are
``store.builtin_docs``). Used by the actors, the service and the CLI.

The flow (record, embed, recall, forget) is `BuiltinProvider`'s, once for both store engines; what
differs between them is a `DocIndex`: `index_sqlite.SqliteIndex` (with `builtin/ranking.py`'s FTS5
statements) or `index_pg.PgIndex` (tsvector and pgvector, docs/fleet.md).

Storage on SQLite: `builtin_docs` (one row per episode: scope, its FTS5 scope
token `scope_key`, the episode as fields — `title` (its summary, else the start of its excerpt),
`excerpt`, `summary`, `files`, `failures`, `meta` (harness, adapter, model, repository, branch, outcome,
reason, run id, pull request) and plain `harness`, `branch`, `outcome` —, started_at, content hash),
`builtin_fts` (FTS5, `porter unicode61`, external-content over builtin_docs — the text is stored once —
with the columns scope_key, title, excerpt, files, failures and meta, kept in step by triggers;
migrations `0006_builtin_scope_in_fts` and `0009_flat_text_and_builtin_fields`), and — only when an
embedding model is configured — `builtin_vec`, a plain table of one int8 embedding per episode
(`index_sqlite.VEC_FORM`) clustered by scope and cell, scored by cosine in numpy. It is
created lazily once the model's dimension is known, and rebuilt (emptied) when the model or dimension
changes. Embeddings are cached in `builtin_embed_cache` by the digest of their embedding text plus the
model key, so re-recording or re-embedding the same content never calls the model API again; a cache
row points at its document's vector rather than copying it (the vector is stored once).

Ranking (`builtin/ranking.py`): reciprocal rank fusion (k = 60) of up to three rankings — BM25 over FTS5 in
the caller's scopes, cosine (hybrid only: the query's embedding against `builtin_vec`, best 200 in the
caller's scopes) and the path boost for a request carrying `paths` (the episodes whose `files_touched`
contains one of them exactly, repository-relative) — ties by recency, then id. Without an embedding
model the ranking is BM25 (plus the path boost) alone. A metadata-only query (REQ-14's briefing query)
is ordered by what helps the next run of the harness it names instead (`ranking.briefing_order`: its
own recent runs first).

Embedding happens at record time, after the text is committed, under its own deadline: a failure
(model API down, budget spent, deadline) leaves the episode without a vector and is only logged
(`memactors doctor` counts such episodes). The query is embedded under the recall's embedding deadline,
concurrently with the BM25 search; a query that cannot be embedded is answered from FTS5 with
`degraded: "embeddings_unavailable"` — never an error.

Item text is the episode's gist (`gist.gist`): the run's own words first (its summary, else
the start of its excerpt), then the words around the query's when they come later, then what it touched
and which verify failures it had — no field names, nothing the provenance line says, only the episode's
own words. At most MAX_ITEM_TEXT characters; for a briefing's (metadata-only) query, the run's first
sentence and what it touched, at most BRIEFING_ITEM_TEXT (so two fit a default briefing). The
whole episode is one `memactors memory episodes <id>` away.

Scope is enforced here too: recall only ever reads rows in the requested scopes. `memory_forget` of an
unknown id answers `{forgotten: false}`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import mcp.types as t
import sqlite_utils
import trio
from loguru import logger
from mcp.server import Server

from .. import contract
from .._version import __version__
from ..contract import load_schemas
from ..documents import gist
from ..errors import InvalidArgument, MemactorsError
from ..modelapi import ModelApiError
from ..store import Db, Store
from ..store.builtin_docs import BM25_WEIGHTS as BM25_WEIGHTS
from ..store.builtin_docs import CONTENT_COLUMNS as CONTENT_COLUMNS
from ..store.builtin_docs import FTS_COLUMNS as FTS_COLUMNS
from ..store.builtin_docs import DocFields, doc_fields
from . import ranking as _ranking
from .index import DocIndex as DocIndex
from .index_sqlite import SQLITE_INDEX, put_doc
from .index_sqlite import cached_vector as cached_vector
from .index_sqlite import ensure_vec_table as ensure_vec_table
from .index_sqlite import insert_doc as insert_doc
from .index_sqlite import write_vector as write_vector
from .ranking import BRIEFING_CANDIDATES as BRIEFING_CANDIDATES
from .ranking import CANDIDATES as CANDIDATES
from .ranking import FUSE_DEPTH as FUSE_DEPTH
from .ranking import RELEVANCE_FLOOR as RELEVANCE_FLOOR
from .ranking import RRF_K as RRF_K
from .ranking import STOPWORDS as STOPWORDS
from .ranking import Hit as Hit
from .ranking import bm25_candidates as bm25_candidates
from .ranking import briefing_order as briefing_order
from .ranking import briefing_rank as briefing_rank
from .ranking import coverage as coverage
from .ranking import embedded_share as embedded_share
from .ranking import fuse_hybrid as fuse_hybrid
from .ranking import metadata_only as metadata_only
from .ranking import names_scope as names_scope
from .ranking import path_candidates as path_candidates
from .ranking import path_ranking as path_ranking
from .ranking import query_words as query_words
from .ranking import rank as rank
from .ranking import relevance_scores as relevance_scores
from .ranking import rrf as rrf
from .ranking import scoped_match as scoped_match
from .ranking import search_words as search_words
from .ranking import unknown_share as unknown_share
from .vector_cells import divide_scopes

CONTRACT_VERSION = 1
#: Bound on one item's text (its gist, `gist.gist`): the run's own words first. Small enough that an
#: item fits whole in a default briefing's episodes share (500 characters with its one-line provenance
#: and fence, REQ-14: placed whole or dropped whole).
MAX_ITEM_TEXT = 320
#: Bound on the text of an item answering a briefing's query (a metadata-only query, REQ-14): the first
#: line of what the run said, then what it touched (`gist.gist` with `subject`). Small enough that two
#: items fit whole in a default briefing's 500-character episodes share with their provenance lines
#: (up to ~110 characters: a 40-hex `git-<sha>` run id) and fences (at 320, only one did).
BRIEFING_ITEM_TEXT = 80
#: Characters of an episode's text sent to the embedding model (the model truncates anyway).
EMBED_INPUT_CHARS = 8000
#: Characters of an episode's embedding text (`embedding_text`): more than the model's window holds.
EMBED_TEXT_CHARS = 1500
#: Default deadline for embedding one batch of episodes in the background.
RECORD_EMBED_DEADLINE = 60.0
#: Episodes per background embedding batch: small, so a query's embedding never waits long for a core.
EMBED_BATCH = 16
#: After a failed batch (model API down, budget spent), the embedder waits this long before trying again.
EMBED_RETRY_SECONDS = 30.0
#: Default deadline for embedding a query; the service passes half of provider_timeout.
QUERY_EMBED_DEADLINE = 1.0
#: How much longer than the query deadline a store read's thread waits for the query's vector at
#: most: the embedding task sets it (or gives up) within the deadline; this only bounds the wait
#: should that task never run.
QUERY_VECTOR_SLACK = 1.0
#: Store reads that may wait for their query's vector at once (`_rank_while_embedding`): half the
#: store's read connections (4), so the others stay free for the rest of the daemon's reads.
WAITING_READS = 2
#: A recall embeds at most this many of its text candidates that have no vector yet (the text
#: ranking's best: what the fusion reads), in one batch (`BuiltinProvider.embed_candidates`).
RECALL_EMBED = FUSE_DEPTH
#: Query vectors kept (least recently used out first): an agent asking the same question again, or
#: several agents asking the same one, costs no model run. ~3 KB a vector at 384 dimensions.
QUERY_VECTORS_CACHED = 256

Embedder = Callable[[Sequence[str]], Awaitable[list[list[float]]]]

_log = logger.bind(component="builtin_provider")


def _tools() -> list[t.Tool]:
    schemas = load_schemas()
    descriptions = {
        "memory_contract": "Contract version and provider identity.",
        "memory_record_episode": "Store one episode; returns the ids it is stored under.",
        "memory_recall": "Search episodes in the given scopes.",
        "memory_forget": "Forget one stored id.",
    }
    return [t.Tool(name=name, description=text, input_schema=schemas[f"{name}.input"])
            for name, text in descriptions.items()]


def content_hash(text: str, summary: str) -> str:
    """The embedding cache key's content part: SHA-256 over text NUL summary."""
    return hashlib.sha256(f"{text}\0{summary}".encode()).hexdigest()


def embed_input(text: str, summary: str) -> str:
    """A query's text as sent to the embedding model (bounded)."""
    return (f"{summary}\n{text}" if summary else text)[:EMBED_INPUT_CHARS]


#: The version of `embedding_text`: part of the vectors' model key (`vector_model`), so a change to
#: what is embedded re-embeds every store (the old vectors are retired, the cache misses). Version 2
#: dropped the touched paths (`embedding_text` says why).
EMBED_TEXT_VERSION = 2


def embedding_text(summary: str, excerpt: str, failures: Sequence[Sequence[Any]]) -> str:
    """What is embedded for an episode: what the run said and did — its summary (REQ-7) when
    it has one, else its result excerpt's words — then its verify failure classes. No field names, no
    ids, no timestamps: in the model's window, every token is the run's.

    Not its touched paths: on the real
    histories of httpx, attrs and black, cosine alone over the words scored MRR 0.465 on 266
    questions against 0.432 with up to 8 paths after them (0.659 against 0.514 on black's other-words
    questions); paths are BM25's `files` column and the path ranking's, where they match exactly.
    The text is cut at EMBED_TEXT_CHARS (the model reads its first 128 word pieces)."""
    words = " ".join((summary or excerpt).split())
    classes = " ".join(dict.fromkeys(str(f[0]) for f in failures if f and f[0]))
    return "\n".join(p for p in (words, classes) if p)[:EMBED_TEXT_CHARS]


def vector_model(model: str) -> str:
    """The model key stored with every vector and cache row: the model id and `EMBED_TEXT_VERSION`."""
    return f"{model}+text{EMBED_TEXT_VERSION}"


def doc_digest(summary: str, excerpt: str, failures: str) -> str:
    """The embedding cache's key of a stored document's text (its `failures` as JSON): `DocDigest`."""
    return text_digest(embedding_text(summary, excerpt, json.loads(failures or "[]")))


def text_digest(text: str) -> str:
    """The embedding cache key's content part for an embedding text."""
    return hashlib.sha256(text.encode()).hexdigest()


def item_texts(db: sqlite_utils.Database, hits: Sequence[Hit], words: Sequence[str], *,
               briefing: bool = False) -> dict[str, str]:
    """Each hit's item text, its gist (`gist.gist`) for the query's `words`, from its stored fields in
    one statement for all the hits; for a briefing's query, its short form (BRIEFING_ITEM_TEXT)."""
    if not hits:
        return {}
    ids = list(dict.fromkeys(hit.doc_id for hit in hits))
    rows: dict[int, dict[str, Any]] = {}
    for chunk in _chunks(ids):
        for r in db.execute(
                f"SELECT doc_id, summary, excerpt, files, failures FROM builtin_docs"
                f" WHERE doc_id IN ({','.join('?' * len(chunk))})", chunk).fetchall():
            rows[int(r[0])] = {"summary": r[1], "result_excerpt": r[2], "files_touched": json.loads(r[3]),
                               "verify_failures": json.loads(r[4])}
    width = BRIEFING_ITEM_TEXT if briefing else MAX_ITEM_TEXT
    return {hit.episode_id: gist(rows[hit.doc_id], words, width, subject=briefing)
            for hit in hits if hit.doc_id in rows}


def _chunks(ids: Sequence[int], size: int = 500) -> list[Sequence[int]]:
    """`ids` in slices small enough for one statement's bound parameters."""
    return [ids[i:i + size] for i in range(0, len(ids), size)]


# -- the engines' part -----------------------------------------------------------------------------

def record_fields(text: str, summary: str, files: Sequence[str],
                  episode: Mapping[str, Any] | None = None) -> DocFields:
    """The fields of a memory_record_episode call's episode: its REQ-5 object (`episode`) where it has
    them, the call's summary and files, else the lines of its rendering `text` (every engine's rule)."""
    given: dict[str, Any] = {"summary": summary or None, **({"files_touched": list(files)} if files else {})}
    return doc_fields(text, {**given, **(episode or {})})


def write_doc(db: sqlite_utils.Database, *, episode_id: str, scope: str, text: str, summary: str,
              files: Sequence[str], started_at: str,
              episode: Mapping[str, Any] | None = None) -> tuple[int, str, bool]:
    """Insert or replace one episode's document (SQLite); returns (doc_id, content hash, changed).

    `episode` is the REQ-5 object memory_record_episode carries; what it lacks is read from `text`.
    """
    digest = content_hash(text, summary)
    fields = record_fields(text, summary, files, episode)
    doc_id, changed = put_doc(db, episode_id=episode_id, scope=scope, fields=fields, started_at=started_at,
                              digest=digest)
    return doc_id, digest, changed


def missing_vectors(db: Any) -> int:
    """Episodes the built-in provider holds without an embedding (doctor warns when non-zero), on the
    engine `db` is of."""
    return index_of(db.dialect.name).missing_vectors(db)


def index_of(engine: str) -> DocIndex:
    """The built-in provider's `DocIndex` on store engine `engine` ("sqlite" or "postgresql")."""
    if engine == "postgresql":
        from .index_pg import PG_INDEX

        return PG_INDEX
    return SQLITE_INDEX


class BuiltinProvider:
    """The contract's four operations over the store's builtin_* tables, on either store engine (the
    engine's part is `self.index`, a `DocIndex`; the flow below is the same on both).

    `embedder` (texts → vectors, e.g. `ModelApiClient.embed`) and `embedding_model` switch on hybrid
    ranking; both or neither. `query_embed_deadline` bounds the query embedding inside a recall and
    `record_embed_deadline` the episode embedding inside a record.
    """

    name = "builtin"

    def __init__(self, store: Store, *, embedder: Embedder | None = None, embedding_model: str | None = None,
                 query_embed_deadline: float = QUERY_EMBED_DEADLINE,
                 record_embed_deadline: float = RECORD_EMBED_DEADLINE,
                 query_embedder: Embedder | None = None, relevance_floor: float | None = None) -> None:
        if (embedder is None) != (not embedding_model):
            raise ValueError("embedder and embedding_model go together")
        self.store = store
        self.index = index_of(store.engine)
        self.embedder = embedder
        #: The query's embedder (the embedded model keeps a thread of its own for queries, so a query
        #: never waits behind a background batch); the episodes' one by default.
        self.query_embedder = query_embedder or embedder
        self.embedding_model = embedding_model or ""
        self.query_embed_deadline = query_embed_deadline
        #: An item scoring below it (`ranking.relevance_scores`, 0–1) is not served; None:
        #: `ranking.RELEVANCE_FLOOR`.
        self.relevance_floor = relevance_floor
        self.record_embed_deadline = record_embed_deadline
        #: What the background embedder has done since start (`memory status`).
        self.embed_stats: dict[str, Any] = {"embedded": 0, "from_cache": 0, "at_recall": 0, "failed_batches": 0,
                                            "last_error": None, "running": False}
        #: Episodes without a vector as this process last counted them (a record adds one, a pass
        #: recounts), and since when there have been some (UTC, ISO; None when every one has its
        #: vector): `memory status`, doctor and the metrics read them without a store read.
        self.pending_vectors = 0
        self.pending_since: str | None = None
        self._wake: trio.Event | None = None
        self._pass_done: trio.Event | None = None
        #: Query vectors by (model, text sent to the model), most recently used last.
        self._query_vectors: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        #: Taken (from a store read's thread, never blocking) by a read that waits for its query's vector.
        self._waiting_reads = threading.BoundedSemaphore(WAITING_READS)
        #: (scope, scope number, word) -> the highest doc id shown not to hold the word in its metadata
        #: (`ranking.metadata_only`; SQLite).
        self._meta_absent: dict[tuple[str, int, str], int] = {}

    @property
    def hybrid(self) -> bool:
        return self.embedder is not None

    @property
    def vector_model(self) -> str:
        """The key the vectors are stored under: the model id and the embedding-text version."""
        return vector_model(self.embedding_model)

    async def check_vectors(self) -> bool:
        """At start, with an embedding model: whether vectors can be stored (sqlite-vec ships with the
        SQLite engine; PostgreSQL needs pgvector, and says once when it is missing)."""
        model = self.embedding_model
        return bool(await self.store.write(lambda db: self.index.check_vectors(db, model, doc_digest)))

    # -- record ---------------------------------------------------------------------------------
    async def record(self, args: dict[str, Any]) -> dict[str, Any]:
        """Store the episode's document; its vector comes later, from the background embedder
        (`embed_worker`), which this wakes: recording never waits for a model."""
        return (await self._record_docs([args]))[0]

    async def record_many(self, args: dict[str, Any]) -> dict[str, Any]:
        """`contract.RECORD_MANY`: `record` for each of ``args["episodes"]``, every document written in
        one store transaction (an ingest batch's episodes: one commit instead of one each)."""
        return {"results": await self._record_docs(args["episodes"])}

    async def _record_docs(self, episodes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Write the episodes' documents in one store transaction, count the new ones as waiting for a
        vector and wake the embedder: each episode's `record` answer, in order."""
        docs = []
        for one in episodes:
            episode = one.get("episode") or {}
            text = str(one["text"])
            summary = str(episode.get("summary") or "")
            files = [str(f) for f in episode.get("files_touched") or []]
            docs.append((str(one["episode_id"]), str(one["scope"]), str(episode.get("started_at") or ""),
                         content_hash(text, summary),
                         record_fields(text, summary, files, episode if isinstance(episode, dict) else None)))

        def write(db: Any) -> int:
            changed = 0
            for episode_id, scope, started_at, digest, fields in docs:
                changed += bool(self.index.write_doc(db, episode_id=episode_id, scope=scope, fields=fields,
                                                     started_at=started_at, digest=digest)[1])
            return changed

        changed = await self.store.write(write)
        if changed and self.hybrid:
            self._count_pending(self.pending_vectors + changed)
        self.wake()
        return [{"ids": [doc[0]]} for doc in docs]

    # -- embeddings (REQ-11), in the background -------------------------------------------------
    async def embed_pending(self, *, everything: bool = False,
                            progress: Callable[[int], None] | None = None) -> int:
        """Give every document without a vector its vector, EMBED_BATCH at a time, newest first: from
        the cache (content hash of its `embedding_text` + `vector_model`) when it has one, else from the
        embedder. Vectors of another model or text version are retired first (`everything`: all of
        them), so an upgrade re-embeds. Returns how many documents got a vector; a failing embedder
        raises (MemactorsError) with the batches before it kept."""
        assert self.embedder is not None
        embedder = self.embedder
        index = self.index
        model = self.vector_model
        await self.store.write(lambda db: index.retire_vectors(db, model, everything=everything))
        done = 0
        seen: set[int] = set()
        before: int | None = None  # keyset paging, newest first: each page starts below the last one
        while True:
            def page(db: Db, before: int | None = before) -> list[tuple[int, str, str, str, str, str]]:
                return index.pending_docs(db, EMBED_BATCH, before)

            rows = await self.store.read(page)
            if not rows and before is not None:  # recorded meanwhile, above the cursor: one more look from the top
                before = None
                rows = await self.store.read(lambda db: index.pending_docs(db, EMBED_BATCH))
            # A batch that brings no new document ends the pass: a store that cannot hold vectors (a
            # PostgreSQL database without pgvector) keeps answering the same ones, whose vectors went
            # to the cache only.
            rows = [r for r in rows if int(r[0]) not in seen]
            if not rows:
                return done
            seen.update(int(r[0]) for r in rows)
            before = min(int(r[0]) for r in rows)
            keyed = _keyed(rows)

            def from_cache(db: Any, keyed: list[tuple[int, str, str, str]] = keyed) -> set[int]:
                return {doc_id for doc_id, scope, _text, digest in keyed
                        if index.vector_from_cache(db, doc_id=doc_id, scope=scope, model=model, digest=digest)}

            cached = await self.store.write(from_cache)
            todo = [k for k in keyed if k[0] not in cached]
            if todo:
                vectors: list[list[float]] | None = None
                with trio.move_on_after(self.record_embed_deadline):
                    vectors = await embedder([k[2] for k in todo])
                if vectors is None or len(vectors) != len(todo):
                    raise ModelApiError("the embedding model did not answer within the deadline")

                await self._store_vectors(todo, vectors)
            self.embed_stats["embedded"] += len(todo)
            self.embed_stats["from_cache"] += len(cached)
            done += len(rows)
            if progress is not None:
                progress(done)

    async def _store_vectors(self, todo: Sequence[tuple[int, str, str, str]],
                             vectors: Sequence[Sequence[float]]) -> None:
        """Write the vectors of documents (doc_id, scope, text, digest) in one store transaction; one
        forgotten meanwhile gets none (no orphan vector)."""
        index, model = self.index, self.vector_model

        def store_vectors(db: Any) -> None:
            for (doc_id, scope, _text, digest), vector in zip(todo, vectors, strict=True):
                if index.doc_exists(db, doc_id):
                    index.write_vector(db, doc_id=doc_id, scope=scope, model=model, digest=digest, vector=vector)

        await self.store.write(store_vectors)

    def vectors_pending(self) -> bool:
        """Whether some documents may still wait for their vector (as this process last counted: a
        record adds to the count, each back-fill pass recounts the store), so a recall looks for its
        candidates without one (`embed_candidates`); when none wait, it costs a recall nothing."""
        return bool(self.pending_vectors) or bool(self.embed_stats["running"])

    async def embed_candidates(self, hits: Sequence[Hit], deadline: float | None = None) -> int:
        """Give a recall's text candidates that have no vector yet (the text ranking's best
        RECALL_EMBED, recorded and not back-filled: right after `runs ingest` or an import) their
        vectors now, in one batch through the query's embedder by `deadline` (trio time: the recall's
        query-embedding deadline, which the query's own embedding shares, so the two stay within half
        of provider_timeout; default query_embed_deadline from now), and write them, so the back-fill
        skips them and the recall scores them as it does once every episode has its vector (ranked on
        their text alone, a question the store cannot answer was answered with an item holding some of
        its words). Returns how many got one; on a failure or past the deadline, none (they are ranked
        on their text, as before)."""
        doc_ids = [h.doc_id for h in hits[:RECALL_EMBED]]
        if not doc_ids or self.query_embedder is None:
            return 0
        embedder = self.query_embedder
        rows = await self.store.read(lambda db: self.index.pending_docs(db, len(doc_ids), among=doc_ids))
        if not rows:
            return 0
        todo = _keyed(rows)
        vectors: list[list[float]] | None = None
        with trio.move_on_at(trio.current_time() + self.query_embed_deadline if deadline is None else deadline):
            try:
                vectors = await embedder([k[2] for k in todo])
            except MemactorsError as exc:
                _log.bind(error=type(exc).__name__).warning("recall candidates not embedded; ranked on their text")
                return 0
        if vectors is None or len(vectors) != len(todo):
            return 0
        await self._store_vectors(todo, vectors)
        self.embed_stats["at_recall"] += len(todo)
        self._count_pending(max(0, self.pending_vectors - len(todo)), keep=True)
        return len(todo)

    async def embed_worker(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """The background embedder: back-fills the store at start (an upgrade's re-embedding, vectors
        missing after a failure), then embeds what each record adds. A failing batch is logged and
        tried again after EMBED_RETRY_SECONDS; recording and recall never wait for it."""
        self._wake = trio.Event()
        self._wake.set()
        self._pass_done = trio.Event()
        task_status.started()
        first_pass = True
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                self.embed_stats["running"] = True
                failed = False
                try:
                    self._count_pending(await self.store.read(self.index.missing_vectors))
                    def progress(done: int, at: int = self.pending_vectors) -> None:
                        self._count_pending(max(0, at - done), keep=True)

                    count = await self.embed_pending(progress=progress)
                    if count or first_pass:  # a large scope's cells, off the recall path
                        await divide_scopes(self.store, self.index)
                    first_pass = False
                    self._count_pending(await self.store.read(self.index.missing_vectors))
                    self.embed_stats["last_error"] = None
                    if count:
                        _log.bind(episodes=count, model=self.embedding_model).debug("episodes embedded")
                except MemactorsError as exc:
                    self.embed_stats["failed_batches"] += 1
                    self.embed_stats["last_error"] = type(exc).__name__
                    _log.bind(error=type(exc).__name__).warning(
                        "episodes left without embedding for now; trying again later")
                    failed = True
                finally:
                    self.embed_stats["running"] = False
                # A failed pass ends like any other for its waiters (they read what is still
                # missing), and the worker is idle while it waits to try again.
                self._release_waiters()
                if failed:
                    await trio.sleep(EMBED_RETRY_SECONDS)
                    self._wake.set()
        finally:
            self._wake = None
            self._release_waiters()

    def _count_pending(self, count: int, *, keep: bool = False) -> None:
        """Note how many episodes wait for a vector; since when there have been some. `keep`: an
        estimate during a pass (never clears the time)."""
        self.pending_vectors = count
        if count and self.pending_since is None:
            self.pending_since = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        elif not count and not keep:
            self.pending_since = None

    def wake(self) -> None:
        """Have the background embedder look for documents without a vector now."""
        if self._wake is not None:
            self._wake.set()

    def _release_waiters(self) -> None:
        if self._pass_done is not None:
            done, self._pass_done = self._pass_done, trio.Event()
            done.set()

    async def wait_embedded(self) -> int:
        """Wait for the background embedder's pass after the latest record (or failure); the documents
        still without a vector then."""
        while self._pass_done is not None and self._wake is not None and (
                self._wake.is_set() or self.embed_stats["running"]):
            await self._pass_done.wait()
        return int(await self.store.read(self.index.missing_vectors))

    async def vector_status(self) -> dict[str, Any]:
        """The vectors' state for `memory status`: documents, with a vector, pending, and the worker's
        counts."""
        total, have = await self.store.read(self.index.vector_count)
        if total == have:
            self._count_pending(0)
        elif self.pending_since is None:  # left from before this start (or a reindex --all)
            self._count_pending(total - have)
        return {"model": self.embedding_model, "text_version": EMBED_TEXT_VERSION, "episodes": total,
                "with_vector": have, "pending": total - have, "pending_since": self.pending_since,
                **self.embed_stats}

    # -- recall ---------------------------------------------------------------------------------
    async def recall(self, args: dict[str, Any]) -> dict[str, Any]:
        scopes = [str(s) for s in args["scope"]][:2]
        limit = max(1, min(20, int(args.get("limit", 8))))
        paths = [str(p) for p in args.get("paths") or []][:20]
        query = str(args.get("query", ""))
        words = search_words(query)
        hybrid = self.embedder is not None and bool(query.strip())
        index = self.index
        # A query whose words only select the scope's episodes (metadata_only) is answered by
        # briefing_order, with no snippet words and no cosine ranking.
        meta_mode = False

        def text_ranking(db: Any) -> list[Hit]:
            nonlocal meta_mode
            meta_mode = bool(words) and (names_scope(words, scopes) or self.index.metadata_only(db, words, scopes, self._meta_absent))
            if meta_mode:
                return index.briefing_order(db, words, scopes)
            if words:
                # The text ranking alone (no path boost, no cosine): the answer is its first `limit`, so
                # ask for those.
                # (FUSE_DEPTH, not `limit`: the ones under the relevance floor leave room for the next.)
                return index.text_candidates(db, words, scopes, limit, CANDIDATES if paths else FUSE_DEPTH)
            return []

        def fuse(db: Any, text: list[Hit], cosine: list[Hit]) -> list[tuple[str, str, float]]:
            if meta_mode:
                cosine = []
            hits = {h.episode_id: h for h in cosine}
            hits.update((h.episode_id, h) for h in text)
            started = {eid: h.started_at for eid, h in hits.items()}
            # What the score is made of: the words each candidate holds and, hybrid, which of
            # the text ranking's have a vector (one without is ranked on its text alone).
            candidates = [*text, *cosine[:FUSE_DEPTH]]
            evidence = index.evidence(db, words, scopes, [h.doc_id for h in candidates], vectors=bool(cosine))
            embedded = {h.episode_id for h in candidates if h.doc_id in evidence.vectored}
            # BM25 alone: REQ-11's order (RRF of the one ranking is its order). Hybrid: the
            # fusion of the best FUSE_DEPTH of each ranking (`ranking.fuse_hybrid`).
            text_rank = [h.episode_id for h in text]
            fused = (fuse_hybrid(text, cosine, embedded) if cosine
                     else rrf([text_rank[:FUSE_DEPTH]] if text else []))
            # Scored: the fused candidates, the only ones an answer can hold besides the path ranking's
            # (scored 1.0 below); not the cosine ranking's other CANDIDATES - FUSE_DEPTH.
            score = relevance_scores({eid: hits[eid] for eid in fused}, evidence, cosine, fused.keys(),
                                     filling=bool(cosine) and embedded_share(text, embedded) < 1)
            floor = 0.0 if meta_mode else (
                _ranking.RELEVANCE_FLOOR if self.relevance_floor is None else self.relevance_floor)
            if paths:
                # The path ranking is decisive: the episodes that touched a requested path, newest
                # first (what an agent about to edit it needs), the text match breaking ties; then the
                # other matches by fused score, those above the floor.
                text_order = rank(fused, started, len(fused))
                touched = index.path_candidates(db, paths, scopes, [hits[eid].doc_id for eid in text_order])
                for hit in touched:
                    hits.setdefault(hit.episode_id, hit)
                    started.setdefault(hit.episode_id, hit.started_at)
                    score[hit.episode_id] = 1.0  # it touched a path the caller asked about
                path_rank = path_ranking(touched, fused)
                order = sorted(path_rank, key=path_rank.__getitem__)[:limit]
                if len(order) < limit:
                    order += [eid for eid in text_order
                              if eid not in path_rank and score[eid] >= floor][:limit - len(order)]
            else:
                order = [eid for eid in rank(fused, started, len(fused)) if score[eid] >= floor][:limit]
            texts = item_texts(db, [hits[eid] for eid in order], () if meta_mode else words, briefing=meta_mode)
            return [(eid, texts[eid], score[eid]) for eid in order if eid in texts]

        def text_only(db: Any) -> list[tuple[str, str, float]]:
            return fuse(db, text_ranking(db), [])

        degraded: str | None = None
        known = self._cached_query_vector(query) if hybrid else None
        if not hybrid:  # one read transaction, one worker-thread hop
            ranked = await self.store.read(text_only)
        elif known is not None and not self.vectors_pending():  # a query embedded before: one hop

            def both(db: Any, vector: list[float] = known) -> list[tuple[str, str, float]]:
                text = text_ranking(db)
                return fuse(db, text, [] if meta_mode else index.knn(db, vector, scopes))

            ranked = await self.store.read(both)
        elif not self.vectors_pending():  # every episode has its vector: the rankings and fusion in one read
            ranked, vectored = await self._rank_while_embedding(
                query, text_ranking, lambda: not meta_mode, lambda db, text, vector: fuse(
                    db, text, index.knn(db, vector, scopes) if vector is not None else []))
            if not vectored:
                degraded = "embeddings_unavailable"
        else:  # right after an ingest: the text ranking while the query is embedded; the text candidates
            # without a vector embedded (`embed_candidates`, written); then the cosine ranking and the fusion
            embed_by = trio.current_time() + self.query_embed_deadline  # the query's and its candidates'
            text: list[Hit] = []
            vector: list[float] | None = None

            async def text_side() -> None:
                nonlocal text
                text = await self.store.read(text_ranking)

            async def vector_side() -> None:
                nonlocal vector
                vector = known if known is not None else await self._embed_query(query)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(text_side)
                nursery.start_soon(vector_side)
            if vector is None:
                degraded = "embeddings_unavailable"
            elif not meta_mode and self.vectors_pending():  # right after an ingest: scored as once filled
                await self.embed_candidates(text, embed_by)

            def knn_and_fuse(db: Any, vector: list[float] | None = vector) -> list[tuple[str, str, float]]:
                return fuse(db, text, index.knn(db, vector, scopes) if vector is not None else [])

            ranked = await self.store.read(knn_and_fuse)
        out: dict[str, Any] = {"items": [{"id": eid, "text": text, "score": round(score, 4)}
                                         for eid, text, score in ranked]}
        if degraded:
            out["degraded"] = degraded
        return out

    async def _rank_while_embedding(
            self, query: str, text_ranking: Callable[[Any], list[Hit]], wants_vector: Callable[[], bool],
            fuse: Callable[[Any, list[Hit], list[float] | None], list[tuple[str, str, float]]],
    ) -> tuple[list[tuple[str, str, float]], bool]:
        """A hybrid recall of a query not embedded before: ``fuse(db, text_ranking(db), vector)``, and
        whether the query got its vector.

        The query is embedded (its own thread) while one store read ranks by text; that read then
        waits for the vector and runs the cosine ranking and the fusion in the same transaction, so
        the recall costs one read hop, not one for the text and another for the rest (up to
        WAITING_READS such reads at once; any other fuses in a second read, as before). Its thread
        waits only as long as the embedding may take (the query deadline: a failure or a deadline
        gives no vector, and the answer is the text ranking's, as before), and not at all when the
        text ranking says the vector is not wanted (``wants_vector()`` false: a metadata-only query,
        which the cosine ranking does not order). Where the store runs a read on the trio thread
        itself (nothing can be waited for there), a vector not there yet is fused in a second read
        too."""
        box = _QueryVector()

        async def embed() -> None:
            try:
                box.vector = await self._embed_query(query)
            finally:
                box.done.set()  # whatever happened: the read never waits past this

        def rank(db: Any) -> tuple[list[Hit], list[tuple[str, str, float]] | None]:
            text = text_ranking(db)
            if not wants_vector():
                return text, fuse(db, text, None)
            # A worker thread (the trio thread embeds meanwhile), and a read connection to spare: at
            # most WAITING_READS reads wait at once, so recalls queued for the model never hold every
            # read connection while other requests' reads wait for one.
            if not trio.lowlevel.in_trio_run() and self._waiting_reads.acquire(blocking=False):
                try:
                    box.done.wait(self.query_embed_deadline + QUERY_VECTOR_SLACK)
                finally:
                    self._waiting_reads.release()
            if not box.done.is_set():
                return text, None
            return text, fuse(db, text, box.vector)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(embed)
            text, ranked = await self.store.read(rank)
        if ranked is None:  # the read ran before the vector was there (on the trio thread)

            def knn_and_fuse(db: Any, vector: list[float] | None = box.vector) -> list[tuple[str, str, float]]:
                return fuse(db, text, vector)

            ranked = await self.store.read(knn_and_fuse)
        return ranked, box.vector is not None

    def _cached_query_vector(self, query: str) -> list[float] | None:
        """The vector of ``query`` if it was embedded before by this model (and is still cached)."""
        key = (self.embedding_model, query[:EMBED_INPUT_CHARS])
        vector = self._query_vectors.get(key)
        if vector is not None:
            self._query_vectors.move_to_end(key)
        return vector

    async def _embed_query(self, query: str) -> list[float] | None:
        """The query's vector, or None when it cannot be had within the query deadline. Kept in a
        bounded cache keyed by model and text (`QUERY_VECTORS_CACHED`); a failure is not cached."""
        assert self.query_embedder is not None
        text = query[:EMBED_INPUT_CHARS]
        with trio.move_on_after(self.query_embed_deadline):
            try:
                vector = (await self.query_embedder([text]))[0]
                self._query_vectors[(self.embedding_model, text)] = vector
                while len(self._query_vectors) > QUERY_VECTORS_CACHED:
                    self._query_vectors.popitem(last=False)
                return vector
            except MemactorsError as exc:
                _log.bind(error=type(exc).__name__).warning("query not embedded; answering from the text index")
                return None
        _log.bind(error="deadline").warning("query not embedded; answering from the text index")
        return None

    # -- forget ---------------------------------------------------------------------------------
    async def forget(self, args: dict[str, Any]) -> dict[str, Any]:
        episode_id = str(args["id"])
        return {"forgotten": await self.store.write(lambda db: self.index.forget(db, episode_id))}

    def contract(self) -> dict[str, Any]:
        return {"contract": CONTRACT_VERSION, "provider": {"name": self.name, "version": __version__}}

    # -- MCP ------------------------------------------------------------------------------------
    def server(self, *, validate_requests: bool = False) -> Server[Any]:
        """The MCP server exposing the four contract tools.

        With `validate_requests` every call is checked against the shipped input schema (and REQ-3's
        bounds) first and refused as a tool error naming the field: what `serve-builtin --stdio` does,
        since any MCP client may call it. In-process the daemon has already checked the same schema.
        """
        tools = _tools()
        if not validate_requests:  # in-process: the daemon's batch record is listed (the SDK warns otherwise)
            tools.append(t.Tool(name=contract.RECORD_MANY, description="Store many episodes (in-process only).",
                                input_schema={"type": "object", "required": ["episodes"],
                                              "properties": {"episodes": {"type": "array"}}}))

        async def list_tools(ctx: Any, params: Any) -> t.ListToolsResult:
            return t.ListToolsResult(tools=tools)

        async def call_tool(ctx: Any, params: t.CallToolRequestParams) -> t.CallToolResult:
            args = dict(params.arguments or {})
            if validate_requests and params.name in contract.TOOLS:
                try:
                    contract.check_request(params.name, args)
                except InvalidArgument as exc:
                    return _error(f"{params.name}: INVALID_ARGUMENT: {exc}")
            try:
                match params.name:
                    case "memory_contract":
                        out = self.contract()
                    case "memory_record_episode":
                        out = await self.record(args)
                    case contract.RECORD_MANY if not validate_requests:  # in-process only: never listed
                        out = await self.record_many(args)
                    case "memory_recall":
                        out = await self.recall(args)
                    case "memory_forget":
                        out = await self.forget(args)
                    case other:
                        return _error(f"unknown tool {other}")
            except (KeyError, TypeError, ValueError) as exc:
                return _error(f"{params.name}: bad arguments ({type(exc).__name__})")
            except MemactorsError as exc:  # the store down (PostgreSQL): a provider error, not a crash
                return _error(f"{params.name}: {exc.code}: {exc}")
            return t.CallToolResult(content=[t.TextContent(type="text", text=json.dumps(out))], structured_content=out)

        return Server("memactors-builtin", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


def _keyed(rows: Sequence[tuple[int, str, str, str, str, str]]) -> list[tuple[int, str, str, str]]:
    """Documents waiting for a vector (`DocIndex.pending_docs` rows) as (doc_id, scope, embedding text,
    the text's digest): what the model is sent and the vector cache is keyed by."""
    keyed = []
    for doc_id, scope, summary, excerpt, _files, failures in rows:
        text = embedding_text(summary or "", excerpt or "", json.loads(failures or "[]"))
        keyed.append((int(doc_id), str(scope), text, text_digest(text)))
    return keyed


class _QueryVector:
    """A query's vector as its embedding task leaves it (None: none could be had), and the event a
    store read's thread waits on for it (`BuiltinProvider._rank_while_embedding`)."""

    def __init__(self) -> None:
        self.vector: list[float] | None = None
        self.done = threading.Event()


def _error(message: str) -> t.CallToolResult:
    return t.CallToolResult(content=[t.TextContent(type="text", text=message)], is_error=True)
